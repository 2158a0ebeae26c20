"""Accuracy statistics on per-question correctness. Pure functions.

A score is a proportion of a finite set of questions, so it is never exact: 0 of 16 has a 95%
Wilson upper bound of 19%. Both arms answer the same questions, so the comparison is paired:
only the questions the arms disagree on carry information (McNemar's insight). The gate's
interval for the paired difference is Tango's asymptotic score interval (1998), which stays
honest with few or no discordant questions. Newcombe's hybrid score interval (method 10) is kept
beside it: it borrows the arms' correlation and, when a candidate only loses questions (what a
fault looks like), PASSed a drop exactly at the margin 4-10% of the time at n = 40-200 in
simulation instead of 2.5% (tests/unit/test_accuracy_gate.py); Tango's 0-1%."""

from __future__ import annotations

import math
from dataclasses import dataclass

from scipy import optimize
from scipy import stats as sps


def wilson(k: int, n: int, alpha: float = 0.05) -> tuple[float, float]:
    if n == 0:
        return 0.0, 1.0
    z = float(sps.norm.ppf(1 - alpha / 2))
    p = k / n
    mid = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, mid - half), min(1.0, mid + half)


@dataclass(frozen=True)
class Paired:
    n: int
    both: int  # both arms right
    base_only: int  # baseline right, candidate wrong
    cand_only: int
    neither: int

    @property
    def base_score(self) -> float:
        return (self.both + self.base_only) / self.n if self.n else float("nan")

    @property
    def cand_score(self) -> float:
        return (self.both + self.cand_only) / self.n if self.n else float("nan")

    @property
    def diff(self) -> float:
        return (self.cand_only - self.base_only) / self.n if self.n else float("nan")


def pair(base: dict[int, bool], cand: dict[int, bool]) -> Paired:
    """Per-question correctness keyed by question id; only questions both arms answered count."""
    ids = sorted(set(base) & set(cand))
    a = sum(base[i] and cand[i] for i in ids)
    b = sum(base[i] and not cand[i] for i in ids)
    c = sum(cand[i] and not base[i] for i in ids)
    return Paired(len(ids), a, b, c, len(ids) - a - b - c)


def newcombe_paired(p: Paired, alpha: float = 0.05) -> tuple[float, float]:
    """(1 - alpha) interval for candidate - baseline accuracy on the same questions."""
    if p.n == 0:
        return -1.0, 1.0
    n, a, b, c, d = p.n, p.both, p.base_only, p.cand_only, p.neither
    p1, p2 = p.base_score, p.cand_score
    l1, u1 = wilson(a + b, n, alpha)
    l2, u2 = wilson(a + c, n, alpha)
    den = (a + b) * (c + d) * (a + c) * (b + d)
    # Newcombe's continuity adjustment of phi (1998, method 10; as Fagerland et al.'s
    # contingencytables and Altman 2000 compute it): a positive ad - bc is reduced by n/2, not
    # below 0. Without it the interval is too narrow where a candidate only loses questions.
    ad_bc: float = a * d - b * c
    ad_bc = max(ad_bc - n / 2, 0.0) if ad_bc > 0 else ad_bc
    phi = ad_bc / math.sqrt(den) if den else 0.0
    theta = p2 - p1
    lo = theta - math.sqrt(max(0.0, (p2 - l2) ** 2 - 2 * phi * (p2 - l2) * (u1 - p1) + (u1 - p1) ** 2))
    hi = theta + math.sqrt(max(0.0, (u2 - p2) ** 2 - 2 * phi * (u2 - p2) * (p1 - l1) + (p1 - l1) ** 2))
    return max(-1.0, lo), min(1.0, hi)


def tango_paired(p: Paired, alpha: float = 0.05) -> tuple[float, float]:
    """(1 - alpha) interval for candidate - baseline accuracy on the same questions: Tango's
    asymptotic score interval, each bound the difference at which the score statistic (with the
    discordant cell's maximum-likelihood estimate restricted to that difference) equals -z or z.
    Reference: (59, 6, 16, 80) -> [-0.1240, -0.0054] (Fagerland, Lydersen and Laake 2017, ch. 8)."""
    n = p.n
    if n == 0:
        return -1.0, 1.0
    z = float(sps.norm.ppf(1 - alpha / 2))
    est = (p.cand_only - p.base_only) / n

    def score(d: float) -> float:
        return _tango_score(p, d)

    tol = 1e-9
    lo = -1.0 if est == -1 else float(optimize.brentq(lambda d: score(d) - z, -1 + tol, 1 - tol, xtol=1e-10))
    hi = 1.0 if est == 1 else float(optimize.brentq(lambda d: score(d) + z, -1 + tol, 1 - tol, xtol=1e-10))
    return lo, hi


def _tango_score(p: Paired, d: float) -> float:
    """Tango's score statistic for candidate - baseline = d (the discordant cell's maximum-likelihood
    estimate restricted to d); it falls as d rises."""
    n, gain, loss = p.n, p.cand_only, p.base_only
    b = -gain - loss + (2 * n - gain + loss) * d
    c = -loss * d * (1 - d)
    q = (math.sqrt(max(b * b - 8 * n * c, 0.0)) - b) / (4 * n)  # P(baseline only) under d
    var = n * (2 * q + d * (1 - d))
    num = gain - loss - n * d
    return num / math.sqrt(var) if var > 0 else math.copysign(math.inf, num)


def tango_p_below(p: Paired, d0: float) -> float:
    """One-sided p of "candidate - baseline is below d0" (Tango's score test): the interval at
    two-sided alpha lies wholly below d0 exactly when this is at most alpha / 2, so a
    non-inferiority FAIL at margin m is p <= alpha / 2 with d0 = -m."""
    if p.n == 0:
        return 1.0
    return float(sps.norm.cdf(_tango_score(p, d0)))


def mcnemar_exact(p: Paired) -> float:
    """Two-sided exact McNemar p-value (binomial on the discordant questions)."""
    k, m = min(p.base_only, p.cand_only), p.base_only + p.cand_only
    if m == 0:
        return 1.0
    return min(1.0, 2 * float(sps.binom.cdf(k, m, 0.5)))


def newcombe_unpaired(k1: int, n1: int, k2: int, n2: int, alpha: float = 0.05) -> tuple[float, float]:
    """(1 - alpha) interval for p2 - p1 of independent samples (Newcombe's square-and-add
    Wilson interval): for results without per-question records."""
    p1, p2 = (k1 / n1 if n1 else 0.0), (k2 / n2 if n2 else 0.0)
    l1, u1 = wilson(k1, n1, alpha)
    l2, u2 = wilson(k2, n2, alpha)
    d = p2 - p1
    return d - math.sqrt((p2 - l2) ** 2 + (u1 - p1) ** 2), d + math.sqrt((u2 - p2) ** 2 + (p1 - l1) ** 2)
