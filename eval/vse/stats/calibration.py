"""Calibration: does each gate see a regression of known size? Pure functions of analysed runs.

A calibration arm adds `p` ms of work to every engine step (eval/vse/server/planted.py). What that
must do to each gated metric follows from the baseline's own measurements:
- Decode measures (ITL per token, its trimmed mean, per-chunk ITL, TPOT): every decode step grows
  by p, so the per-token gap grows by p: truth = p / the baseline's value of that measure.
- Output throughput, on a closed loop that keeps the engine busy: the run lasts its engine steps
  x p longer (steps counted by vLLM itself, vllm:iteration_tokens_total's count):
  truth = D / (D + steps x p) - 1, averaged over the baseline's runs.
- First-wave TTFT: the median first-wave request waits for about half the wave's prefill steps
  (wave x ISL / max_num_batched_tokens chunks): truth ~= p x that / baseline value (an estimate).
The minimum detectable effect at 80% power is the change a design of the scenario's planned
starts would detect with the variances this calibration measured, for the gates' Welch test (mde)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import scipy.stats as sps

from vse.stats import registry
from vse.stats.decide import GateInput, decide
from vse.stats.estimate import welch_df
from vse.stats.registry import keys_for

STEPS_KEY = "vllm:iteration_tokens_total_count"
MDE_DRAWS = 200_000  # the MDE's Monte Carlo error is then about 0.2% of its value
# Decode measures shown side by side in every calibration (the evidence the decode gate was chosen
# by): each grows by p per decode step, so truth = p / its baseline value.
DECODE = keys_for("decode")  # the metric registry (stats/registry.py) says which


@dataclass(frozen=True)
class Planted:
    gpu_ms: float
    cpu_ms: float
    steps: str  # all, prefill, decode

    @property
    def ms(self) -> float:
        return self.gpu_ms + self.cpu_ms


@dataclass(frozen=True)
class BaselineFacts:
    """What the truths are computed from: the baseline arm's measured values."""

    decode_ms: dict[str, float]  # the baseline's value of each DECODE measure
    durations_s: list[float]  # per run
    engine_steps: list[float | None]  # per run, vLLM's own count (None where not scraped)
    ttft_first_wave_ms: float
    first_wave: int | None
    input_len: int
    max_num_batched_tokens: int | None


def truth(metric: str, p: Planted, b: BaselineFacts) -> float | None:
    """The relative change the planted work must cause in `metric` (None: no formula for it)."""
    decode = p.steps in ("all", "decode")
    prefill = p.steps in ("all", "prefill")
    if metric in DECODE:  # every decode step grows by p
        base = b.decode_ms.get(metric, float("nan"))
        return (p.ms / base if base > 0 else None) if decode else 0.0
    if metric == registry.OUTPUT_THROUGHPUT:
        runs = [(d, s) for d, s in zip(b.durations_s, b.engine_steps) if s]
        if not runs or p.steps != "all":
            return None
        return float(np.mean([d / (d + s * p.ms / 1000) - 1 for d, s in runs]))
    if metric == registry.MEDIAN_TTFT_FIRST_WAVE:
        if not prefill or not b.first_wave or not b.max_num_batched_tokens or not b.ttft_first_wave_ms:
            return 0.0 if not prefill else None
        steps = math.ceil(b.first_wave / 2 * b.input_len / b.max_num_batched_tokens)
        return steps * p.ms / b.ttft_first_wave_ms
    return None


def mde(var_base: float, var_cand: float, starts: int, alpha: float, power: float = 0.8) -> float:
    """Smallest relative change a design of `starts` + `starts` server starts detects with this
    power at two-sided level alpha, given per-start variances of the log values, for Welch's test
    as the gates run it: its standard error and df are estimated from the starts themselves. The
    textbook (t_{1-a/2,df} + t_{power,df}) x SE treats them as known and, at 3 + 3 starts, names a
    change that is detected 68% of the time at alpha 0.05 and 55% at a first look's 0.0125, not
    80%. Solved on fixed draws (seeded, so a report rebuilds identically): the two variance
    estimates (chi-square, starts - 1 df each) and the estimate's error;
    tests/unit/test_operating.py checks it against the sequential simulation."""
    if not (math.isfinite(var_base) and math.isfinite(var_cand)) or starts < 2:
        return float("nan")
    se_true = math.sqrt((var_base + var_cand) / starts)
    if se_true == 0:
        return 0.0
    rng = np.random.default_rng(20261205)
    z = rng.standard_normal(MDE_DRAWS)
    sb = var_base * rng.chisquare(starts - 1, MDE_DRAWS) / (starts - 1) / starts
    sc = var_cand * rng.chisquare(starts - 1, MDE_DRAWS) / (starts - 1) / starts
    bound = (
        sps.t.ppf(1 - alpha / 2, welch_df(sb, sc, starts)) * np.sqrt(sb + sc) - z * se_true
    )  # detected when the change exceeds it
    return math.expm1(float(np.quantile(bound, power)))


@dataclass
class Row:
    run: str
    planted: str
    metric: str
    role: str  # "gated" (the run's own gate decided it) or "shown" (decided here as if gated alone)
    margin_pct: float | None
    truth_pct: float | None
    change_pct: float
    ci_low_pct: float
    ci_high_pct: float
    covered: bool | None
    outcome: str
    mde_pct: float


def rows(
    run: str,
    planted_text: str,
    p: Planted | None,
    b: BaselineFacts,
    comparisons: list,
    gates: list,
    margins: dict[str, float],
    gate_alpha: float,
    planned_starts: int,
) -> list[Row]:
    """One row per gated metric of one calibration comparison, then each DECODE measure not gated,
    decided here alone at the decode gate's margin (p None: an A/A, truth 0)."""
    by_key = {c.key: c for c in comparisons}
    outcome = {g.metric: g.outcome.value for g in gates if g.metric}
    decode_margin = next((m for k, m in margins.items() if k in DECODE), 5.0)
    shown = {k: decode_margin for k in DECODE if k not in margins}
    out = []
    for key, margin in [*margins.items(), *shown.items()]:
        c = by_key.get(key)
        if c is None:
            continue
        t = 0.0 if p is None else truth(key, p, b)
        lo, hi = c.est.ci(gate_alpha)
        covered = None if t is None or not math.isfinite(lo) else bool(lo <= t <= hi)
        if key in margins:
            role, result = "gated", outcome.get(key, "n/a")
        else:
            role = "shown"
            result = decide([GateInput(key, c.est, c.higher_is_better, margin / 100)], gate_alpha)[0].outcome.value
        out.append(
            Row(
                run,
                planted_text,
                key,
                role,
                margin,
                None if t is None else 100 * t,
                100 * c.rel_change,
                100 * lo,
                100 * hi,
                covered,
                result,
                100 * mde(c.var_base, c.var_cand, planned_starts, gate_alpha),
            )
        )
    return out


def as_dicts(rs: list[Row]) -> list[dict[str, Any]]:
    return [asdict(r) for r in rs]
