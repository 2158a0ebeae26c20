"""Whose pace the client read: its mean inter-token time per token against vLLM's own.

vLLM's `vllm:inter_token_latency_seconds` is taken from the engine core's output timestamps, made
in the engine's process, so an API server that falls behind does not enter it; the client's clock
sees every token only once the API server has written it. Over a run the two means agree where the
API server (and the client) keep up with the engine, whatever the chunk packing: then a decode
measure times the engine, which is what a kernel changes. Where they part, the client timed a
queue behind the engine, and a decode gate would decide that queue's speed instead of the kernel's:
such gates are not decided (the other gates are: throughput and TTFT are end-to-end as a user sees
them)."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from vse.analysis.load import ArmAnalysis
from vse.rundir.records import SERVER_MEAN_ITL
from vse.stats import registry
from vse.stats.decode import KEEP_UP

# Well below a decode gate's margin (5%), well above what runs that kept pace show (docs/measurements.md,
# "Engine or API server: whose pace the client reads").
TOLERANCE = 0.02
# The per-request arrays a decode measure is built from (registry.MetricDef.source)
DECODE_SOURCES = frozenset({"tpot", "itl", "itl_token", "decode_first"})


@dataclass(frozen=True)
class ArmPace:
    arm: str
    ratios: list[float]  # per run: the client's mean ITL per token / vLLM's own

    @property
    def mean(self) -> float:
        return statistics.fmean(self.ratios)

    @property
    def off(self) -> bool:
        return abs(self.mean - 1) > TOLERANCE


def arm_pace(a: ArmAnalysis) -> ArmPace | None:
    """None where no run has both (per-token timing needs workload.usage_per_chunk; vLLM's counters a
    scrape of /metrics)."""
    ratios = []
    for m, d in zip(a.repeats, a.server_deltas):
        client, server = m.get(registry.MEAN_ITL_TOKEN), (d or {}).get(SERVER_MEAN_ITL)
        if client and server and math.isfinite(client) and math.isfinite(server):
            ratios.append(float(client) / float(server))
    return ArmPace(a.name, ratios) if ratios else None


def off_pace(arms: dict[str, ArmAnalysis]) -> str | None:
    """Why the decode gates cannot be decided on this run, or None where the client kept pace."""
    off = [p for a in arms.values() if (p := arm_pace(a)) is not None and p.off]
    if not off:
        return None
    said = ", ".join(f"{p.arm} {100 * (p.mean - 1):+.1f}% over {len(p.ratios)} run(s)" for p in off)
    return (
        f"the client's mean ITL per token differs from vLLM's own (engine-timestamped) by {said}, more "
        f"than {100 * TOLERANCE:g}%: it timed the API server's (or its own) pace, not the engine's; {KEEP_UP} "
        "(more client processes, workload.client_processes, where the client fell behind)"
    )


def refused_metrics(why: str | None, defs: list[registry.MetricDef]) -> dict[str, str]:
    """Decode metrics a gate may not decide, each with why (off_pace's answer; empty where the client
    kept pace)."""
    return {m.key: why for m in defs if m.source in DECODE_SOURCES} if why else {}
