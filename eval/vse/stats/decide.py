"""Decisions in the language of non-inferiority, for the metrics a scenario gates. Pure functions.

For each gated metric with margin d (max_worse_pct / 100), on the log scale where the interval
lives, let w be how much worse the candidate is (log ratio, signed so that worse is positive)
and M the margin (log(1 + d) for latencies, -log(1 - d) for throughputs):

- PASS: non-inferiority shown. The worse-side bound of the two-sided (1 - alpha) interval is
  below the margin, i.e. H0 "w >= M" is rejected one-sided at alpha / 2. A release passes only
  when every gate passes; that is an intersection-union test, which needs no multiplicity
  correction to keep the chance of passing a real regression at alpha / 2.
- FAIL: the whole interval lies beyond the margin, i.e. H0 "w <= M" is rejected one-sided. Any
  one FAIL blocks, so these tests are Holm-corrected across the gated metrics: a candidate
  within every margin is blocked with chance at most alpha / 2 however many metrics are gated.
- INCONCLUSIVE: neither. The report then says roughly how many more server starts per arm would
  decide it, assuming the point estimate and the per-start variances stay as observed.

Sequential runs (more server starts until the verdict is settled: `settled`) spend alpha over the planned
looks by the information fraction t = starts / max_starts: alpha_k = alpha (t_k^2 - t_(k-1)^2),
t_0 = 0. The alphas sum to alpha, so by the union bound the chance of any wrong decision at any
look stays at most alpha, whatever the stopping rule.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy import stats as sps

from vse.stats.estimate import Design, Estimate, t_quantile, t_sf, welch_df


class Outcome(str, enum.Enum):
    PASS = "pass"
    FAIL = "fail"
    INCONCLUSIVE = "inconclusive"
    NOT_APPLICABLE = "n/a"


def settled(outcomes: list[Outcome]) -> bool:
    """Whether a sequential design stops at this look: every gate decided, or one FAILed. A FAIL
    blocks whatever the undecided gates would later say, so more starts would cost device time and
    could not change the verdict."""
    return Outcome.FAIL in outcomes or Outcome.INCONCLUSIVE not in outcomes


@dataclass(frozen=True)
class GateInput:
    name: str
    est: Estimate
    higher_is_better: bool
    margin: float  # fraction, e.g. 0.05


@dataclass(frozen=True)
class GateDecision:
    name: str
    outcome: Outcome
    worse: float  # relative change in the worse direction (0.02 = 2% worse)
    worse_low: float  # (1 - alpha) two-sided interval of `worse`
    worse_high: float
    margin: float
    p_fail_adj: float  # Holm-adjusted p of "beyond the margin"
    more_starts: int | None  # None: decided, or not decidable from here
    detail: str
    p_fail: float = 1.0  # the same p before Holm (a sweep corrects across its points with it)


def margin_log(margin: float, higher_is_better: bool) -> float:
    """The margin on the log scale. A higher-is-better metric cannot lose more than 100%: a margin
    of 100% or more allows anything (a scenario's max_worse_pct: 100 on throughput crashed this)."""
    if higher_is_better:
        return math.inf if margin >= 1 else -math.log(1 - margin)
    return math.log1p(margin)


def _worse_log(e: Estimate, higher_is_better: bool) -> float:
    return -e.diff if higher_is_better else e.diff


def _to_rel(w: float, higher_is_better: bool) -> float:
    """Log-scale 'worse' back to a relative change in the worse direction."""
    return -math.expm1(-w) if higher_is_better else math.expm1(w)


def holm(pvalues: list[float]) -> list[float]:
    """Holm step-down adjusted p-values (monotone, capped at 1)."""
    order = sorted(range(len(pvalues)), key=lambda i: pvalues[i])
    adj, running = [1.0] * len(pvalues), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(pvalues) - rank) * pvalues[i]))
        adj[i] = running
    return adj


def standing_fails(tests: list[tuple[float, float]]) -> list[bool]:
    """Across a release's comparisons: which FAIL tests still reject when all of them are taken
    together. tests: (p of "beyond the margin" before any correction, the alpha its run decided at).
    A run FAILs a gate at p <= alpha / 2 (Holm within the run); across the release each p is scaled
    to its own level, q = p / (alpha / 2), and Holm's step-down rejects while q * (tests left) <= 1:
    the chance that any comparison within its margins is blocked stays at most the mean alpha / 2,
    however many entries and gates the release holds. PASS decisions are not touched: a release
    passes only when every gate passes, which needs no correction."""
    q = [p / (a / 2) if a > 0 else math.inf for p, a in tests]
    stands = [False] * len(q)
    for rank, i in enumerate(sorted(range(len(q)), key=q.__getitem__)):
        if q[i] * (len(q) - rank) > 1:
            break
        stands[i] = True
    return stands


def starts_to_decide(e: Estimate, w: float, m: float, alpha_at: Callable[[int], float], cap: int = 50) -> int | None:
    """Server starts per arm at which the interval would clear the margin if the estimate held,
    at the alpha the plan spends at that look (alpha_at) and Welch's df for those starts."""
    gap = abs(w - m)
    if e.design is not Design.STARTS or not math.isfinite(e.var_base) or gap == 0:
        return None
    starts = np.arange(max(e.n_base, e.n_cand) + 1, cap + 1)
    if not len(starts):
        return None
    sb, sc = e.var_base / starts, e.var_cand / starts
    se = np.sqrt(sb + sc)
    df = welch_df(sb, sc, starts)
    alpha = np.array([alpha_at(int(k)) for k in starts])
    # one vectorised quantile call: this runs for every undecided gate, and simulations decide thousands
    decides = (se == 0) | (sps.t.ppf(1 - alpha / 2, df) * se < gap)
    return int(starts[np.argmax(decides)]) if decides.any() else None


def decide(
    gates: list[GateInput],
    alpha: float,
    alpha_at: Callable[[int], float] | None = None,
    max_starts: int | None = None,
    estimate_more: bool = True,
) -> list[GateDecision]:
    """Three outcomes per gated metric; see the module docstring. alpha_at(starts) is the alpha
    the plan spends at a later look (for the 'more starts' estimate; default: this look's) and
    max_starts the plan's last look (an estimate beyond it says so). estimate_more=False skips
    that estimate (a simulation of the design, which adds the starts itself, has no use for it)."""
    rows, p_fail = [], []
    for g in gates:
        e = g.est
        w, m = _worse_log(e, g.higher_is_better), margin_log(g.margin, g.higher_is_better)
        usable = e.design is Design.STARTS and math.isfinite(e.se)
        if not usable:
            p_fail.append(1.0)
        elif e.se == 0:
            p_fail.append(0.0 if w > m else 1.0)
        else:
            p_fail.append(t_sf((w - m) / e.se, e.df))
        rows.append((g, w, m, usable))
    adj = holm(p_fail) if rows else []
    out = []
    for (g, w, m, usable), pf, raw in zip(rows, adj, p_fail):
        e = g.est
        rel = _to_rel(w, g.higher_is_better) if math.isfinite(w) else float("nan")
        if not usable:
            why = (
                "one server start per arm: a quick look, which ignores start-to-start variation and never gates"
                if e.design is Design.QUICK_LOOK
                else "no interval: needs 2+ server starts per arm"
            )
            out.append(
                GateDecision(
                    g.name, Outcome.INCONCLUSIVE, rel, float("nan"), float("nan"), g.margin, 1.0, None, why, raw
                )
            )
            continue
        t = t_quantile(1 - alpha / 2, e.df) if e.se > 0 else 0.0
        lo_w, hi_w = w - t * e.se, w + t * e.se
        lo, hi = _to_rel(lo_w, g.higher_is_better), _to_rel(hi_w, g.higher_is_better)
        if hi_w < m:
            outcome = Outcome.PASS
        elif pf <= alpha / 2:
            outcome = Outcome.FAIL
        else:
            outcome = Outcome.INCONCLUSIVE
        more = beyond = None
        if outcome is Outcome.INCONCLUSIVE and estimate_more:
            s = starts_to_decide(e, w, m, alpha_at or (lambda _k: alpha))
            more = None if s is None else s - min(e.n_base, e.n_cand)
            beyond = s is not None and max_starts is not None and s > max_starts
        # The interval is of the change toward worse (what the margin bounds); the lead says which
        # way the estimate went in plain words, so "-2.7% worse" never has to be decoded.
        lead = f"{100 * abs(rel):.2f}% {'worse' if rel > 0 else 'better'}"
        detail = (
            f"{lead}; change toward worse {100 * rel:+.2f}%, {100 * (1 - alpha):.4g}% interval "
            f"[{100 * lo:+.2f}%, {100 * hi:+.2f}%] vs margin {100 * g.margin:g}% ({e.n_base} + {e.n_cand} server starts)"
        )
        if outcome is Outcome.INCONCLUSIVE and estimate_more:
            detail += (
                f"; about {more} more server start(s) per arm would likely decide it"
                + (f", beyond the plan's {max_starts} per arm (run.max_server_starts)" if beyond else "")
                if more is not None
                else "; at the observed spread not even 50 server starts per arm would likely decide it (the "
                "estimate sits at the margin, or the metric is too noisy for it)"
            )
        out.append(GateDecision(g.name, outcome, rel, lo, hi, g.margin, pf, more, detail, raw))
    return out


def spent_alpha(alpha: float, starts: int, first: int, max_starts: int | None) -> float:
    """alpha for the look at `starts` server starts per arm, in a plan that looks first at `first`
    starts and then after each added start up to max_starts (None: one fixed look, all of alpha).
    Power-2 spending of the information fraction t = starts / max_starts: alpha (t_k^2 - t_(k-1)^2)
    with t = 0 before the first look, so the first look already spends alpha (first / max)^2 and
    the looks together spend exactly alpha."""
    if max_starts is None or max_starts <= first:
        return alpha
    k = max(first, min(starts, max_starts))
    t, prev = k / max_starts, ((k - 1) / max_starts if k > first else 0.0)
    return alpha * (t * t - prev * prev)
