"""Statistics: each metric's relative change with a confidence interval that respects how the
data were made, and an exploratory verdict. Pure functions of raw records; no I/O.

What varies, and so what the interval must cover: runs (repeats) are nested in server starts,
which are nested in arms. Requests of one run share their server's state and are not
independent; runs on one server share its start (its memory layout, its compiled graphs, its
clocks). A server-start offset is invisible to any spread measured within one start, so the
replication unit is the server start: each start's runs are averaged (on the log scale), and the
interval is a Welch t-interval across the starts' means. With one start per arm the suite can
still show a Welch interval across runs, but labels it a quick look: it ignores start-to-start
variation and is never used by a gate.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field

import numpy as np
from scipy import special

from vse.rundir.records import RequestRecord
from vse.stats.decode import first_wave_decode
from vse.stats.metrics import measured, statistic
from vse.stats.registry import MetricDef, metric_defs


class Verdict(str, enum.Enum):
    BETTER = "better"
    WORSE = "worse"
    NO_CHANGE = "no significant change"
    NOT_AVAILABLE = "n/a"


class Design(str, enum.Enum):
    STARTS = "server starts"  # Welch across server-start means: the gated design
    QUICK_LOOK = "quick look: one server start"  # Welch across runs of one start: optimistic
    NONE = "no interval"  # one run per arm


@dataclass
class RepeatData:
    """Per-request arrays of one run (successful measured requests only) and where it ran."""

    duration_s: float
    ttft: np.ndarray
    tpot: np.ndarray
    e2el: np.ndarray
    out_tokens: np.ndarray
    total_tokens: np.ndarray
    good: np.ndarray
    itl: list[np.ndarray]
    failed: int = 0
    itl_token: list[np.ndarray] = field(default_factory=list)  # per token (records.itl_tokens_s)
    start: int = 0  # the server start (within its arm) this run was measured on
    ttft_first: np.ndarray = field(default_factory=lambda: np.array([]))
    ttft_steady: np.ndarray = field(default_factory=lambda: np.array([]))
    energy_j: float | None = None  # the GPUs' energy over the measured load (NVML), None without telemetry
    decode_first: np.ndarray = field(default_factory=lambda: np.array([]))  # per wave request (first_wave_decode_ms)
    decode_first_why: str = ""  # why decode_first is empty: no run leaves a gated metric without a reason

    @property
    def n(self) -> int:
        return len(self.ttft)


def repeat_data(
    records: list[RequestRecord],
    good_fn: Callable[[RequestRecord], bool] | None = None,
    *,
    start: int = 0,
    first_wave: int | None = None,
    energy_j: float | None = None,
) -> RepeatData:
    rs = measured(records)
    ok = [r for r in rs if r.success]
    if rs:
        duration = max((max(r.end_ns for r in rs) - min(r.scheduled_ns for r in rs)) / 1e9, 1e-9)
    else:
        duration = 1e-9
    ms = 1000.0
    # The first wave: the first `first_wave` requests sent (a concurrency limit's worth, all sent
    # at once when the rate is unlimited). None: no such wave (an open-loop rate). A run of no
    # more requests than the limit is one wave: all of it (a sweep's high-concurrency points).
    by_send = sorted(rs, key=lambda r: (r.send_ns, r.index))
    wave_ids = {id(r) for r in by_send[:first_wave]} if first_wave else set()
    first = [r.ttft_s * ms for r in ok if id(r) in wave_ids]
    decode, why = first_wave_decode([r for r in by_send if id(r) in wave_ids])
    steady = [r.ttft_s * ms for r in ok if wave_ids and id(r) not in wave_ids]
    return RepeatData(
        duration_s=duration,
        ttft=np.array([r.ttft_s * ms for r in ok]),
        tpot=np.array([(r.tpot_s if r.tpot_s is not None else np.nan) * ms for r in ok]),
        e2el=np.array([r.e2el_s * ms for r in ok]),
        out_tokens=np.array([r.output_tokens for r in ok], dtype=float),
        total_tokens=np.array([r.output_tokens + r.prompt_len for r in ok], dtype=float),
        good=np.array([bool(good_fn(r)) if good_fn else True for r in ok], dtype=float),
        itl=[np.asarray(r.itls_s) * ms for r in ok],
        itl_token=[np.asarray(r.itl_tokens_s) * ms for r in ok],
        failed=len(rs) - len(ok),
        start=start,
        ttft_first=np.array(first),
        ttft_steady=np.array(steady),
        energy_j=energy_j,
        decode_first=decode,
        decode_first_why=why,
    )


def point_value(d: RepeatData, m: MetricDef) -> float:
    """The run-level value of a metric, exactly as computed from all of the run's requests."""
    if m.stat == "per_token":  # energy per output token, mJ
        tokens = d.out_tokens.sum()
        return float(1000 * d.energy_j / tokens) if d.energy_j is not None and tokens > 0 else float("nan")
    if m.stat == "rate":
        arr = {"out_tokens": d.out_tokens, "total_tokens": d.total_tokens, "good": d.good, "requests": np.ones(d.n)}[
            m.source
        ]
        return float(arr.sum() / d.duration_s)
    if m.source in ("itl", "itl_token"):
        parts = getattr(d, m.source)
        vals = np.concatenate(parts) if parts else np.array([])
    else:
        vals = getattr(d, m.source)
        vals = vals[np.isfinite(vals)]
    return statistic(vals, m.stat) if len(vals) else float("nan")


@dataclass(frozen=True)
class RunValue:
    start: int
    value: float
    excluded: bool = False  # a disturbed run left out of its start's mean (listed in every report)


@dataclass(frozen=True)
class Estimate:
    """log(candidate / baseline) with its standard error and degrees of freedom."""

    diff: float
    se: float
    df: float
    design: Design
    n_base: int  # replication units (starts, or runs in a quick look)
    n_cand: int
    var_base: float  # per-unit variance of log values, for planning more starts
    var_cand: float

    def ci(self, alpha: float) -> tuple[float, float]:
        """Two-sided (1 - alpha) interval for the relative change."""
        if self.design is Design.NONE or not math.isfinite(self.se):
            return float("nan"), float("nan")
        if self.se == 0:
            return math.expm1(self.diff), math.expm1(self.diff)
        t = t_quantile(1 - alpha / 2, self.df)
        return math.expm1(self.diff - t * self.se), math.expm1(self.diff + t * self.se)


def t_quantile(q: float, df: float) -> float:
    """Student's t quantile, bit for bit what scipy.stats.t.ppf(q, df) returns: the scipy.special
    function it calls, without stats.t's per-call argument handling, which costs far more than the
    function itself. Design simulations decide every gate many thousand times."""
    return float(special.stdtrit(df, q))


def t_sf(x: float, df: float) -> float:
    """P(T > x), bit for bit what scipy.stats.t.sf(x, df) returns (see t_quantile)."""
    return float(special.stdtr(df, -x))


def _kept_logs(runs: Sequence[RunValue]) -> list[tuple[int, float]]:
    """(start, log value) of the runs that count: not excluded, finite and positive."""
    return [(r.start, math.log(r.value)) for r in runs if not r.excluded and math.isfinite(r.value) and r.value > 0]


def start_means(runs: Sequence[RunValue]) -> list[float]:
    """Per server start, the mean log value of its kept runs (a start's runs are one unit)."""
    by: dict[int, list[float]] = {}
    for start, v in _kept_logs(runs):
        by.setdefault(start, []).append(v)
    return [float(np.mean(v)) for _, v in sorted(by.items())]


def welch_df(sb: np.ndarray, sc: np.ndarray, starts: int | np.ndarray) -> np.ndarray:
    """Welch-Satterthwaite df of equal-sized arms (`starts` each) from their squared standard errors,
    elementwise; 2 (starts - 1) where both are 0. For plans and simulations over many draws."""
    den = (sb * sb + sc * sc) / (starts - 1)
    return np.where(den > 0, (sb + sc) ** 2 / np.where(den > 0, den, 1), 2 * starts - 2)


def welch(
    lb: Sequence[float] | np.ndarray, lc: Sequence[float] | np.ndarray
) -> tuple[float, float, float, float, float]:
    """(diff, se, df, var_b, var_c) of the means of two samples of log values."""
    b, c = np.asarray(lb, float), np.asarray(lc, float)
    vb, vc = b.var(ddof=1), c.var(ddof=1)
    sb, sc = vb / len(b), vc / len(c)
    se = math.sqrt(sb + sc)
    denom = (sb**2 / (len(b) - 1) if sb else 0.0) + (sc**2 / (len(c) - 1) if sc else 0.0)
    df = (sb + sc) ** 2 / denom if denom else float(len(b) + len(c) - 2)
    return float(c.mean() - b.mean()), se, df, float(vb), float(vc)


def estimate(base: Sequence[RunValue], cand: Sequence[RunValue]) -> Estimate:
    """Welch across server-start means; across runs (a quick look) with one start per arm; no
    interval with fewer than two runs per arm."""
    mb, mc = start_means(base), start_means(cand)
    lb, lc = [v for _, v in _kept_logs(base)], [v for _, v in _kept_logs(cand)]
    for xb, xc, design in ((mb, mc, Design.STARTS), (lb, lc, Design.QUICK_LOOK)):
        if len(xb) >= 2 and len(xc) >= 2:
            diff, se, df, vb, vc = welch(xb, xc)
            return Estimate(diff, se, df, design, len(xb), len(xc), vb, vc)
    diff = float(np.mean(lc) - np.mean(lb)) if lb and lc else float("nan")
    return Estimate(diff, float("nan"), float("nan"), Design.NONE, len(lb), len(lc), float("nan"), float("nan"))


@dataclass
class MetricComparison:
    key: str
    label: str
    higher_is_better: bool
    baseline: float  # geometric mean over server starts of the start means
    candidate: float
    rel_change: float  # candidate / baseline - 1
    ci_low: float
    ci_high: float
    verdict: Verdict  # exploratory: interval at the scenario's significance, no multiplicity correction
    design: Design = Design.NONE
    se_log: float = float("nan")
    df: float = float("nan")
    n_base: int = 0
    n_cand: int = 0
    var_base: float = float("nan")
    var_cand: float = float("nan")
    baseline_runs: list[float] = field(default_factory=list)
    candidate_runs: list[float] = field(default_factory=list)
    baseline_starts: list[int] = field(default_factory=list)
    candidate_starts: list[int] = field(default_factory=list)

    @property
    def est(self) -> Estimate:
        return Estimate(
            math.log1p(self.rel_change) if math.isfinite(self.rel_change) else float("nan"),
            self.se_log,
            self.df,
            self.design,
            self.n_base,
            self.n_cand,
            self.var_base,
            self.var_cand,
        )


def compare_values(m: MetricDef, base: Sequence[RunValue], cand: Sequence[RunValue], alpha: float) -> MetricComparison:
    e = estimate(base, cand)
    mb, mc = start_means(base), start_means(cand)
    bv = math.exp(np.mean(mb)) if mb else float("nan")
    cv = math.exp(np.mean(mc)) if mc else float("nan")
    change = math.expm1(e.diff) if math.isfinite(e.diff) else float("nan")
    lo, hi = e.ci(alpha)
    if not (math.isfinite(lo) and math.isfinite(hi)):
        verdict = Verdict.NOT_AVAILABLE
    elif lo > 0 or hi < 0:
        verdict = Verdict.BETTER if (change > 0) == m.higher_is_better else Verdict.WORSE
    else:
        verdict = Verdict.NO_CHANGE
    return MetricComparison(
        m.key,
        m.label,
        m.higher_is_better,
        bv,
        cv,
        change,
        lo,
        hi,
        verdict,
        e.design,
        e.se,
        e.df,
        e.n_base,
        e.n_cand,
        e.var_base,
        e.var_cand,
        [r.value for r in base],
        [r.value for r in cand],
        [r.start for r in base],
        [r.start for r in cand],
    )


def run_values(data: Sequence[RepeatData], m: MetricDef, excluded: AbstractSet[int] = frozenset()) -> list[RunValue]:
    return [RunValue(d.start, point_value(d, m), i in excluded) for i, d in enumerate(data)]


def compare_arms(
    base: list[RepeatData],
    cand: list[RepeatData],
    percentiles: list[float],
    *,
    goodput: bool = False,
    alpha: float = 0.05,
    excluded: dict[str, set[int]] | None = None,
) -> list[MetricComparison]:
    ex = excluded or {}
    return [
        compare_values(
            m, run_values(base, m, ex.get("baseline", set())), run_values(cand, m, ex.get("candidate", set())), alpha
        )
        for m in metric_defs(percentiles, goodput, energy=all(d.energy_j is not None for d in [*base, *cand]))
    ]


# -- measurement health -----------------------------------------------------------------------


def robust_z(values: Sequence[float]) -> np.ndarray:
    """Iglewicz-Hoaglin modified z: 0.6745 (x - median) / MAD; 0 where MAD is 0."""
    x = np.asarray(values, float)
    med = np.median(x)
    mad = np.median(np.abs(x - med))
    return np.zeros_like(x) if mad == 0 else 0.6745 * (x - med) / mad


def disturbed_runs(values: Sequence[float], *, z_limit: float = 3.5, min_rel: float = 0.01) -> list[int]:
    """Indices of runs far from their siblings: robust |z| above z_limit and more than min_rel
    away from the median (so a tiny MAD cannot flag a 0.1% wobble). Needs 3+ runs."""
    x = np.asarray(values, float)
    if len(x) < 3 or not np.all(np.isfinite(x)):
        return []
    z = robust_z(list(x))
    med = np.median(x)
    return [i for i in range(len(x)) if abs(z[i]) > z_limit and abs(x[i] / med - 1) > min_rel]


@dataclass(frozen=True)
class Modes:
    bimodal: bool
    low: list[float]
    high: list[float]
    r2: float  # share of variance the two-group split explains


def two_modes(values: Sequence[float], *, min_r2: float = 0.8, min_gap: float = 0.10) -> Modes:
    """Best split of sorted run-level values into two groups of 2+ each; bimodal when the split
    explains most of the variance and the groups' means are at least min_gap apart."""
    x = np.sort(np.asarray([v for v in values if math.isfinite(v)], float))
    none = Modes(False, list(x), [], 0.0)
    if len(x) < 4 or x.var() == 0:
        return none
    best = none
    for k in range(2, len(x) - 1):
        lo, hi = x[:k], x[k:]
        r2 = 1 - (lo.var() * len(lo) + hi.var() * len(hi)) / (x.var() * len(x))
        if r2 > best.r2:
            best = Modes(False, list(lo), list(hi), float(r2))
    if not best.high:
        return none
    gap = np.mean(best.high) / np.mean(best.low) - 1
    return Modes(bool(best.r2 >= min_r2 and gap >= min_gap), best.low, best.high, best.r2)
