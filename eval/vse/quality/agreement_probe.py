"""The agreement probe: greedy completions with top-k logprobs from one live server, written to
the run directory for agreement.py to compare; and fixed texts scored teacher-forced (top-k
logprobs at every position of the text) for fidelity.py."""

from __future__ import annotations

import asyncio
import json
from dataclasses import asdict
from pathlib import Path

import aiohttp

from vse.quality.agreement import Completion, prompts_for
from vse.quality.fidelity import Scored
from vse.rundir.files import atomic_write_text
from vse.scenario import AgreementSpec


def _endpoint(base_url: str, api_key: str | None) -> tuple[str, dict[str, str]]:
    """The completions URL and the headers every probe request sends."""
    return base_url.rstrip("/") + "/v1/completions", ({"Authorization": f"Bearer {api_key}"} if api_key else {})


def _write(out: Path, rows: list) -> None:
    atomic_write_text(out, "".join(json.dumps(asdict(x)) + "\n" for x in rows))


async def _post(session: aiohttp.ClientSession, url: str, body: dict, headers: dict[str, str]) -> tuple[dict, str]:
    """(the response's JSON, "") or ({}, the error in one line)."""
    try:
        async with session.post(url, json=body, headers=headers) as r:
            data = await r.json(content_type=None)
            return (data, "") if r.status == 200 else ({}, f"HTTP {r.status}: {str(data)[:200]}")
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
        return {}, f"{type(e).__name__}: {e}"[:300]


async def _one(
    session: aiohttp.ClientSession, url: str, model: str, prompt: str, spec: AgreementSpec, headers: dict[str, str]
) -> Completion:
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": spec.max_tokens,
        "temperature": 0.0,
        "logprobs": max(spec.top_logprobs, 1),
        "seed": 0,
    }
    data, err = await _post(session, url, body, headers)
    c = Completion(prompt, error=err)
    if err:
        return c
    choice = data["choices"][0]
    lp = choice.get("logprobs") or {}
    c.text = choice.get("text", "")
    c.tokens = list(lp.get("tokens") or [])
    c.logprobs = [float(x) if x is not None else float("nan") for x in (lp.get("token_logprobs") or [])]
    c.top_logprobs = [dict(t or {}) for t in (lp.get("top_logprobs") or [])]
    return c


async def _collect(
    base_url: str, model: str, spec: AgreementSpec, concurrency: int, api_key: str | None
) -> list[Completion]:
    url, headers = _endpoint(base_url, api_key)
    sem = asyncio.Semaphore(concurrency)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:

        async def guarded(p: str) -> Completion:
            async with sem:
                return await _one(session, url, model, p, spec, headers)

        return list(await asyncio.gather(*(guarded(p) for p in prompts_for(spec))))


def collect(
    base_url: str, model: str, spec: AgreementSpec, out: Path, concurrency: int = 8, api_key: str | None = None
) -> list[Completion]:
    """Greedy completions with logprobs from one arm; written to out (agreement.jsonl)."""
    comps = asyncio.run(_collect(base_url, model, spec, concurrency, api_key))
    _write(out, comps)
    return comps


async def _score_one(
    session: aiohttp.ClientSession, url: str, model: str, text: str, top_k: int, headers: dict[str, str]
) -> Scored:
    # echo + logprobs + max_tokens 1: the prompt's own logprobs, as lm-eval's loglikelihood asks vLLM
    # for them; the one generated token is dropped.
    body = {"model": model, "prompt": text, "max_tokens": 1, "temperature": 0.0, "echo": True, "logprobs": top_k}
    data, err = await _post(session, url, body, headers)
    sc = Scored(text, error=err)
    if err:
        return sc
    lp = data["choices"][0].get("logprobs") or {}
    n = len(lp.get("tokens") or []) - 1
    sc.tokens = list(lp["tokens"][:n]) if n > 0 else []
    sc.top_logprobs = [dict(t) if t else None for t in (lp.get("top_logprobs") or [])[:n]]
    return sc


async def _score(base_url: str, model: str, texts: list[str], top_k: int, api_key: str | None) -> list[Scored]:
    url, headers = _endpoint(base_url, api_key)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        # One at a time: each text is then computed alone, in the same batches on every server.
        return [await _score_one(session, url, model, t, top_k, headers) for t in texts]


def score(
    base_url: str, model: str, texts: list[str], top_k: int, out: Path, api_key: str | None = None
) -> list[Scored]:
    """Teacher-forced top-k logprobs of fixed texts from one server; written to out (scores.jsonl)."""
    scored = asyncio.run(_score(base_url, model, texts, max(top_k, 1), api_key))
    _write(out, scored)
    return scored
