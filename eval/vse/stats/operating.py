"""What a scenario's sequential design does with a given noise and a given true change, by
simulation with the suite's own decision rule (operating characteristics). Pure functions.

A calibration measures one comparison; this says how often the design would PASS an A/A, FAIL a
planted regression or stay INCONCLUSIVE, and how many server starts it would take, if the
per-start variances were the ones measured. Each arm's server-start means are drawn from normal
distributions on the log scale; at every look the plan counts (server_starts, then one start per
arm more up to max_server_starts) the gates are decided by `decide.decide` at that look's spent
alpha (Holm across the gated metrics, as a run does), and the run stops when `decide.settled` says
so, as `vse compare` does. Metrics are drawn independently: a start that is slow on throughput is
usually slow on the decode step too, which changes the joint rates a little and no single gate's.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

import numpy as np

from vse.stats.decide import GateInput, Outcome, decide, settled, spent_alpha
from vse.stats.estimate import Design, Estimate, welch


@dataclass(frozen=True)
class GateModel:
    """One gated metric: its margin, its per-start variance of log values and the true change."""

    metric: str
    higher_is_better: bool
    margin: float  # fraction, as GateInput's
    var_start: float
    change: float = 0.0  # true relative change, candidate / baseline - 1


@dataclass(frozen=True)
class Plan:
    first: int  # run.server_starts
    last: int  # run.max_server_starts (= first: one fixed look)
    alpha: float  # gates.significance


@dataclass
class Characteristics:
    """Probabilities over the simulated comparisons."""

    # metric -> outcome value, "worse" (interval beyond no change, toward worse) or "pass_worse" -> probability
    gates: dict[str, dict[str, float]]
    verdict: dict[str, float]  # "pass" (every gate), "fail" (any gate), "inconclusive"
    starts: dict[int, float]  # starts per arm at which the run stopped -> probability
    n: int

    @property
    def mean_starts(self) -> float:
        return sum(k * p for k, p in self.starts.items())


def _estimate(b: np.ndarray, c: np.ndarray) -> Estimate:
    diff, se, df, vb, vc = welch(b, c)
    return Estimate(diff, se, df, Design.STARTS, len(b), len(c), vb, vc)


def one_comparison(models: list[GateModel], plan: Plan, rng: np.random.Generator) -> tuple[int, list]:
    """One simulated comparison: the starts per arm where it stopped and its gate decisions."""
    last = max(plan.last, plan.first)
    max_starts = plan.last if plan.last > plan.first else None
    draws = [
        (
            rng.normal(0.0, math.sqrt(m.var_start), last),
            rng.normal(math.log1p(m.change), math.sqrt(m.var_start), last),
        )
        for m in models
    ]
    for k in range(plan.first, last + 1):
        alpha = spent_alpha(plan.alpha, k, plan.first, max_starts)
        inputs = [
            GateInput(m.metric, _estimate(b[:k], c[:k]), m.higher_is_better, m.margin)
            for m, (b, c) in zip(models, draws)
        ]
        decisions = decide(inputs, alpha, estimate_more=False)
        if k == last or settled([d.outcome for d in decisions]):
            break
    return k, decisions


def verdict(decisions: list) -> str:
    """A comparison's verdict from its gate decisions: "fail", "pass" or "inconclusive"."""
    outcomes = [d.outcome for d in decisions]
    if Outcome.FAIL in outcomes:
        return "fail"
    return "pass" if all(o is Outcome.PASS for o in outcomes) else "inconclusive"


def simulate(models: list[GateModel], plan: Plan, n: int = 2000, seed: int = 0) -> Characteristics:
    """Run the design n times on simulated start means; see the module docstring."""
    rng = np.random.default_rng(seed)
    gate_counts: dict[str, Counter] = {m.metric: Counter() for m in models}
    verdicts: Counter = Counter()
    stops: Counter = Counter()
    for _ in range(n):
        k, decisions = one_comparison(models, plan, rng)
        stops[k] += 1
        verdicts[verdict(decisions)] += 1
        for m, d in zip(models, decisions):
            gate_counts[m.metric][d.outcome.value] += 1
            worse = d.worse_low > 0  # the interval lies on the worse side of no change
            gate_counts[m.metric]["worse"] += int(worse)
            gate_counts[m.metric]["pass_worse"] += int(worse and d.outcome is Outcome.PASS)
    return Characteristics(
        gates={k: {o: c / n for o, c in v.items()} for k, v in gate_counts.items()},
        verdict={k: v / n for k, v in verdicts.items()},
        starts={k: v / n for k, v in sorted(stops.items())},
        n=n,
    )
