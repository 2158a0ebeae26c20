"""MEASUREMENT REFERENCE ONLY - a simulated engine, never a stand-in for vLLM.

A closed-loop continuous-batching engine whose step time is known exactly: every step decodes one
token for each running request and takes `step_ms`, plus `prefill_ms` when a new prompt is
prefilled in it (a prefill riding along with decode). Its API side packs each request's tokens into
chunks in a set pattern (1-4 tokens a chunk), as vLLM's API server does when it falls behind, and
reports each chunk's token count as continuous usage stats would. The records it returns are the
suite's own (RequestRecord), so every decode measure can be read against the step it must find.

    python benchmarks/decode_reference.py     # the table in docs/statistics.md ("The decode gate")
"""

from __future__ import annotations

import sys
from collections import deque
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "eval"))

from vse.rundir.records import RequestRecord  # noqa: E402

MS = 1_000_000

# Packing patterns: the chunk sizes a request's tokens are cut into, repeated.
PATTERNS: dict[str, list[int]] = {
    "one token a chunk": [1],
    "30% of chunks carry 2": [1, 1, 2, 1, 1, 1, 2, 1, 1, 2],
    "every 10th chunk carries 4": [1] * 9 + [4],
    "1-4 tokens a chunk": [1, 2, 3, 4, 2, 1],
}


def simulate(
    step_ms: float = 10.0,
    prefill_ms: float = 15.0,
    pattern: list[int] = PATTERNS["one token a chunk"],
    num_prompts: int = 384,
    concurrency: int = 128,
    output_len: int = 1024,
    prefills_per_step: int = 1,
    seed: int = 0,
) -> list[RequestRecord]:
    """One run's measured records. At most `prefills_per_step` prompts are prefilled per step (a
    token budget), so the first wave takes several prefill steps, as on a GPU."""
    rng = np.random.default_rng(seed)
    t_ns = 0
    waiting: deque[int] = deque(range(min(concurrency, num_prompts)))
    sent = {i: 0 for i in waiting}
    next_prompt = len(waiting)
    running: dict[int, list[int]] = {}  # request -> token end times (ns)
    done: dict[int, list[int]] = {}
    while waiting or running:
        new = [waiting.popleft() for _ in range(min(prefills_per_step, len(waiting)))]
        step = step_ms + (prefill_ms if new else 0.0)
        t_ns += int(step * MS)
        for i in list(running):
            running[i].append(t_ns)
            if len(running[i]) == output_len:
                done[i] = running.pop(i)
                if next_prompt < num_prompts:  # closed loop: the client sends the next prompt now
                    waiting.append(next_prompt)
                    sent[next_prompt] = t_ns
                    next_prompt += 1
        for i in new:
            running[i] = [t_ns]  # the prefill step ends with the request's first token
    return [_record(i, sent[i], done[i], pattern, rng) for i in sorted(done)]


def _record(i: int, send_ns: int, tokens: list[int], pattern: list[int], rng) -> RequestRecord:
    """The API side: tokens packed per the pattern (the first token alone, as vLLM sends it), each
    chunk written once its last token is out, plus a small jitter of the API process."""
    chunks, tok, j = [], [], 0
    k_i = 0
    while j < len(tokens):
        k = 1 if j == 0 else min(pattern[k_i % len(pattern)], len(tokens) - j)
        k_i += j > 0
        j += k
        chunks.append(tokens[j - 1] + int(abs(rng.normal(0, 0.05)) * MS))
        tok.append(k)
    chunks = list(np.maximum.accumulate(chunks))
    r = RequestRecord(
        index=i,
        phase="measure",
        prompt_len=1024,
        expected_output_len=len(tokens),
        scheduled_ns=send_ns,
        send_ns=send_ns,
        headers_ns=send_ns,
        chunk_ns=[int(c) for c in chunks],
        chunk_tokens=tok,
        end_ns=int(chunks[-1]) + MS,
        output_tokens=len(tokens),
        usage_completion_tokens=len(tokens),
        token_source="usage",
        chunk_usage=True,
        success=True,
    )
    return r


def table() -> str:
    from vse.stats import estimate as est

    defs = {d.key: d for d in est.metric_defs([99], goodput=False)}
    keys = ("mean_decode_first_wave_ms", "tmean_itl_token_ms", "mean_itl_token_ms", "median_tpot_ms")
    rows = ["| engine | packing | " + " | ".join(keys) + " |", "|---|---|" + "---:|" * len(keys)]
    for step in (10.0, 10.2, 10.5):
        for name, pat in PATTERNS.items():
            d = est.repeat_data(simulate(step_ms=step, pattern=pat), first_wave=128)
            vals = [est.point_value(d, defs[k]) for k in keys]
            rows.append(f"| {step:g} ms step | {name} | " + " | ".join(f"{v:.3f}" for v in vals) + " |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(table())
