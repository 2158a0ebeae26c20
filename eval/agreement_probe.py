"""The agreement probe: greedy completions with top-k logprobs from one live server, written to
the run directory for agreement.py to compare."""

from __future__ import annotations

import asyncio
import json
from dataclasses import asdict
from pathlib import Path

import aiohttp

from .agreement import Completion, prompts_for
from .rundir import atomic_write_text
from .scenario import AgreementSpec


async def _one(session: aiohttp.ClientSession, url: str, model: str, prompt: str, spec: AgreementSpec,
               headers: dict[str, str]) -> Completion:
    body = {"model": model, "prompt": prompt, "max_tokens": spec.max_tokens, "temperature": 0.0,
            "logprobs": max(spec.top_logprobs, 1), "seed": 0}
    c = Completion(prompt)
    try:
        async with session.post(url, json=body, headers=headers) as r:
            data = await r.json(content_type=None)
            if r.status != 200:
                c.error = f"HTTP {r.status}: {str(data)[:200]}"
                return c
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
        c.error = f"{type(e).__name__}: {e}"[:300]
        return c
    choice = data["choices"][0]
    lp = choice.get("logprobs") or {}
    c.text = choice.get("text", "")
    c.tokens = list(lp.get("tokens") or [])
    c.logprobs = [float(x) if x is not None else float("nan") for x in (lp.get("token_logprobs") or [])]
    c.top_logprobs = [dict(t or {}) for t in (lp.get("top_logprobs") or [])]
    return c


async def _collect(base_url: str, model: str, spec: AgreementSpec, concurrency: int,
                   api_key: str | None) -> list[Completion]:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    url = base_url.rstrip("/") + "/v1/completions"
    sem = asyncio.Semaphore(concurrency)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        async def guarded(p: str) -> Completion:
            async with sem:
                return await _one(session, url, model, p, spec, headers)
        return list(await asyncio.gather(*(guarded(p) for p in prompts_for(spec))))


def collect(base_url: str, model: str, spec: AgreementSpec, out: Path, concurrency: int = 8,
            api_key: str | None = None) -> list[Completion]:
    """Greedy completions with logprobs from one arm; written to out (agreement.jsonl)."""
    comps = asyncio.run(_collect(base_url, model, spec, concurrency, api_key))
    atomic_write_text(out, "".join(json.dumps(asdict(c)) + "\n" for c in comps))
    return comps
