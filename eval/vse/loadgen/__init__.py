"""The load generator: an async aiohttp streaming client (client.py) driven by a scheduler
(runner.py) over prompts from datasets.py, producing raw per-request records (records.py)."""
