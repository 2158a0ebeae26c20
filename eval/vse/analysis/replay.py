"""How faithfully a replayed trace was sent and met, per run: how late the client sent each request
against its scheduled time (send lag), and vLLM's prefix-cache hit rate over the run (its own
/metrics counters) beside the rate the trace's block hashes imply for the same requests.

The implied rate assumes an unbounded cache (no block is evicted within a run) and that a block is
reusable once a request that carried it was sent earlier: requests with a shared prefix arriving
together can still both miss it, so the server's rate may sit a little below. It is counted in the
server's own blocks (a hit is a whole KV-cache block, and a prompt's last token is always computed),
on the prompt as the server counted it (a BOS token a tokenizer adds shifts every block)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from vse.analysis.load import ArmAnalysis
from vse.rundir.layout import RunDir
from vse.rundir.records import RequestRecord
from vse.scenario import DatasetKind, Scenario

HITS, QUERIES = "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"
DEFAULT_BLOCK = 16  # vLLM's GPU default, where the server did not say its own
# How far vLLM's hit rate may sit from the implied one (points) before the report says the prompts or
# the cache did not meet the trace's reuse: what prompts built without the hashes miss by is far
# more (tests/integration/test_trace_replay.py).
REUSE_TOLERANCE = 0.05


@dataclass(frozen=True)
class PromptBlocks:
    """What the implied rate needs of one sent prompt (a Prompt's trace fields)."""

    index: int
    prompt_len: int
    hash_ids: Sequence[int]
    block_len: int


@dataclass(frozen=True)
class ReplayRun:
    arm: str
    start: int
    run: int  # the run's prompt set (prompts/prompts-<run>.jsonl)
    requests: int
    lag_ms: dict[str, float]  # send lag p50 / p99 / max
    hit_rate: float | None  # vLLM's, over the measured requests; None where /metrics said nothing
    implied_rate: float  # the trace's, in the server's blocks
    cache_block: int  # the block size the implied rate was counted in
    block_said: bool  # whether the server said its block size (else DEFAULT_BLOCK was assumed)
    disturbed: bool  # p99 send lag above the scenario's max_send_lag_ms (open loop only)

    @property
    def reuse_off(self) -> bool:
        """vLLM's hit rate further than REUSE_TOLERANCE from the implied one."""
        return self.hit_rate is not None and abs(self.hit_rate - self.implied_rate) > REUSE_TOLERANCE


@dataclass(frozen=True)
class ReplayView:
    path: str
    start_s: float
    duration_s: float | None
    time_scale: float
    length_scale: float
    block_len: int
    max_send_lag_ms: float
    open_loop: bool  # no concurrency cap: the lag is the client's own, not a queue
    rows: list[ReplayRun]

    def notes(self) -> list[str]:
        """What this traffic's measures mean, and any run whose prefix reuse was not the trace's."""
        out = [
            "a replayed trace: requests come due on the trace's clock, the same in every run of both arms, "
            "so throughput follows the arrivals and says whether the server kept up, not how fast it can go; "
            "per-request TTFT, TPOT and E2E latency (their percentiles) and goodput at workload.goodput's SLOs "
            "are its measures. The first-wave measures have no first wave here and are not decided"
        ]
        off = [r for r in self.rows if r.reuse_off]
        if not off:
            return out
        runs = ", ".join(f"{r.arm} run {r.run + 1} ({r.hit_rate:.1%} against {r.implied_rate:.1%})" for r in off)
        return out + [
            f"**prefix reuse unlike the trace's** in {runs}: vLLM's prefix-cache hit rate is more than "
            f"{100 * REUSE_TOLERANCE:g} points from what the trace's hashes imply. The prompts did not carry the "
            "trace's shared blocks, or the server's cache held less than the window reuses (a smaller KV cache, "
            "prefix caching off): the run measured other traffic than the trace's"
        ]

    def late(self) -> dict[str, dict[int, str]]:
        """Per arm, its runs (by position) whose client fell behind the schedule, with why."""
        out: dict[str, dict[int, str]] = {}
        for arm in dict.fromkeys(r.arm for r in self.rows):
            for i, r in enumerate(x for x in self.rows if x.arm == arm):
                if r.disturbed:
                    out.setdefault(arm, {})[i] = (
                        f"disturbed by the client: it sent requests {r.lag_ms['p99']:,.1f} ms behind their "
                        f"scheduled times at p99 (max {r.lag_ms['max']:,.1f} ms; the bound is {self.max_send_lag_ms:g} ms)"
                    )
        return out


def implied_hits(prompts: Sequence[PromptBlocks], cache_block: int, bos: int) -> tuple[int, int]:
    """(hit tokens, queried tokens) an unbounded prefix cache of `cache_block`-token blocks would have
    given these prompts, sent in this order: a prompt reuses its leading blocks whose hash an earlier
    prompt carried, up to the length that prompt had of the block."""
    seen: dict[int, int] = {}  # hash -> the most tokens of its block any earlier prompt carried
    hits = queries = 0
    for p in prompts:
        matched = 0
        for j, h in enumerate(p.hash_ids):
            mine = min(p.block_len, p.prompt_len - j * p.block_len)
            had = seen.get(h, 0)
            matched += min(mine, had)
            if had < mine:
                break
        total = p.prompt_len + bos
        hits += min((matched + bos) // cache_block, (total - 1) // cache_block) * cache_block if matched else 0
        queries += total
        for j, h in enumerate(p.hash_ids):
            seen[h] = max(seen.get(h, 0), min(p.block_len, p.prompt_len - j * p.block_len))
    return hits, queries


def send_lag_ms(records: Sequence[RequestRecord]) -> dict[str, float]:
    lag = np.asarray([(r.send_ns - r.scheduled_ns) / 1e6 for r in records if r.send_ns], dtype=float)
    if not lag.size:
        return {}
    return {"p50": float(np.median(lag)), "p99": float(np.percentile(lag, 99)), "max": float(lag.max())}


def _prompt_blocks(path: Path) -> list[PromptBlocks]:
    import json

    out = []
    with open(path) as f:
        for line in f:
            if line.strip():
                row = json.loads(line)
                out.append(
                    PromptBlocks(row["index"], row["prompt_len"], row.get("hash_ids") or [], row.get("block_len") or 1)
                )
    return out


def _bos(records: Sequence[RequestRecord]) -> int:
    """Tokens the server counted beyond the prompt's own (a BOS token): the usage's prompt count less ours."""
    extra = [r.usage_prompt_tokens - r.prompt_len for r in records if r.success and r.usage_prompt_tokens is not None]
    return int(np.median(extra)) if extra else 0


def replay_view(run_dir: Path, s: Scenario, arms: dict[str, ArmAnalysis]) -> ReplayView | None:
    """The view for a replayed trace (None for other datasets)."""
    d = s.workload.dataset
    if d.kind != DatasetKind.TRACE:
        return None
    t, layout = d.replay, RunDir(run_dir)
    open_loop = s.workload.max_concurrency is None
    rows: list[ReplayRun] = []
    for name, arm in arms.items():
        for rep, data in zip(arm.raw, arm.repeat_data):
            k = int(rep.meta.get("repeat", 0))
            measured = [r for r in rep.records if r.phase == "measure"]
            sent = sorted(measured, key=lambda r: (r.scheduled_ns, r.index))
            path = layout.prompts(k)
            by_index = {p.index: p for p in _prompt_blocks(path)} if path.is_file() else {}
            order = [by_index[r.index] for r in sent if r.index in by_index]
            said = rep.meta.get("cache_block_size")
            block = int(said) if said else DEFAULT_BLOCK
            hits, queries = implied_hits(order, block, _bos(measured))
            delta = rep.meta.get("server_metrics_delta") or {}
            q = delta.get(QUERIES)
            lag = send_lag_ms(measured)
            rows.append(
                ReplayRun(
                    arm=name,
                    start=data.start,
                    run=k,
                    requests=len(measured),
                    lag_ms=lag,
                    hit_rate=(delta.get(HITS, 0.0) / q) if q else None,
                    implied_rate=hits / queries if queries else float("nan"),
                    cache_block=block,
                    block_said=bool(said),
                    disturbed=open_loop and lag.get("p99", 0.0) > t.max_send_lag_ms,
                )
            )
    return ReplayView(
        str(d.path),
        t.start_s,
        t.duration_s,
        t.time_scale,
        t.length_scale,
        t.block_len,
        t.max_send_lag_ms,
        open_loop,
        rows,
    )
