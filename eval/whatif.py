"""The what-if arm: FlashInfer's per-tensor FP8 GEMM on a GPU vLLM does not allow it on
(compute capability 8.9-9.x), through the suite's vLLM plugin (plugins/vse-flashinfer-hopper).
Opt-in only (`arms.<arm>.whatif: true`, `make compare WHATIF=1`): the plugin is staged, with its
entry point, on that arm's server PYTHONPATH alone; no environment is modified. Also parses what
FlashInfer's autotuner did at each server start."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from .backends import Backend
from .errors import SuiteError

PLUGIN_DIR = Path(__file__).resolve().parents[1] / "plugins" / "vse-flashinfer-hopper"
PACKAGE = "vse_flashinfer_hopper"
ENV = "VSE_FLASHINFER_WHATIF"
MIN_CC = (8, 9)
LABEL = "what-if: not a configuration vLLM supports on this GPU"


def stage(dest: Path) -> str:
    """Copy the plugin and an entry-point record (a .dist-info, which importlib.metadata finds on
    sys.path) into dest; returns the directory for the server's PYTHONPATH."""
    src = PLUGIN_DIR / PACKAGE
    if not (src / "__init__.py").is_file():
        raise SuiteError(f"what-if: the plugin's source is missing ({src}); run from the suite's repository")
    dest = Path(dest)
    shutil.copytree(src, dest / PACKAGE, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__"))
    info = dest / f"{PACKAGE}-0.1.0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: vse-flashinfer-hopper\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text(f"[vllm.general_plugins]\n{PACKAGE} = {PACKAGE}:register\n")
    return str(dest)


def server_env(plugin_path: str, environ: dict[str, str]) -> dict[str, str]:
    old = environ.get("PYTHONPATH", "")
    return {"PYTHONPATH": plugin_path + (f":{old}" if old else ""), ENV: "1"}


_TS = r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3})"


AUTOTUNE_ALLOWANCE_S = 240.0  # FlashInfer tuning its FP8 GEMM tactics at a start without cached ones (H200: 197 s)


def start_estimate(backend: Backend, starts_done: int, last_start_s: float) -> float:
    """Seconds an arm's next server start will take, for the time budget: the last start's, plus
    FlashInfer's tactic tuning at the arm's first start in this run (a budget that left it out cut
    the H200 what-if arm's first start before it was healthy)."""
    return last_start_s + (AUTOTUNE_ALLOWANCE_S if backend == Backend.FLASHINFER and starts_done == 0 else 0.0)


def autotune_state(log_text: str) -> dict | None:
    """What FlashInfer's autotuner did at this start (None: it did not run): the cache file,
    whether tuned tactics were found there, and how long tuning took."""
    cache = re.search(r"Using FlashInfer autotune cache file: (\S+)", log_text)
    starts = re.findall(_TS + r".*Autotuning process starts", log_text)
    ends = re.findall(_TS + r".*Autotuning process ends", log_text)
    if not cache and not starts:
        return None
    secs = None
    if starts and ends:
        from datetime import datetime
        t = lambda m: datetime.strptime(m[0], "%Y-%m-%d %H:%M:%S").timestamp() + int(m[1]) / 1000  # noqa: E731
        secs = round(t(ends[-1]) - t(starts[0]), 1)
    return {"cache_file": cache.group(1) if cache else None,
            "cache_entries_found": "No FlashInfer autotune cache entries found" not in log_text,
            "autotune_s": secs}
