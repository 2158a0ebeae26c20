"""Statistics: relative change of each metric with a 95% confidence interval, a rank test,
and a verdict. Pure functions of raw records; no I/O.

The interval comes from a two-level bootstrap: resample repeats (so run-to-run spread counts),
then whole requests within each repeat (never single tokens: the tokens of one request are
not independent). Each metric is the mean over repeats of its run-level value, as a reader
of several `vllm bench serve` blocks would average them.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
from scipy import stats as sps

from .loadgen.records import RequestRecord
from .metrics import measured


class Verdict(str, enum.Enum):
    BETTER = "better"
    WORSE = "worse"
    NO_CHANGE = "no significant change"
    NOT_AVAILABLE = "n/a"


@dataclass(frozen=True)
class MetricDef:
    key: str  # as in vLLM's result JSON, e.g. median_ttft_ms
    label: str
    higher_is_better: bool
    source: str  # per-request array it is computed from: ttft, tpot, e2el, itl, out_tokens, good, total_tokens
    stat: str  # mean, median, pNN, rate


def metric_defs(percentiles: list[float], goodput: bool) -> list[MetricDef]:
    defs = [MetricDef("output_throughput", "Output throughput (tok/s)", True, "out_tokens", "rate"),
            MetricDef("total_token_throughput", "Total throughput (tok/s)", True, "total_tokens", "rate"),
            MetricDef("request_throughput", "Request throughput (req/s)", True, "requests", "rate")]
    if goodput:
        defs.append(MetricDef("request_goodput", "Goodput (req/s)", True, "good", "rate"))
    names = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2el": "E2E latency"}
    for src, name in names.items():
        stats_ = ["mean", "median"] + [f"p{int(p) if int(p) == p else p}" for p in percentiles if p != 50]
        for st in stats_:
            label = {"mean": "Mean", "median": "Median"}.get(st, st.upper())
            defs.append(MetricDef(f"{st}_{src}_ms", f"{label} {name} (ms)", False, src, st))
    return defs


@dataclass
class RepeatData:
    """Per-request arrays of one repeat (successful measured requests only)."""

    duration_s: float
    ttft: np.ndarray
    tpot: np.ndarray
    e2el: np.ndarray
    out_tokens: np.ndarray
    total_tokens: np.ndarray
    good: np.ndarray
    itl: list[np.ndarray]
    failed: int = 0

    @property
    def n(self) -> int:
        return len(self.ttft)


def repeat_data(records: list[RequestRecord], good_fn: Callable[[RequestRecord], bool] | None = None) -> RepeatData:
    rs = measured(records)
    ok = [r for r in rs if r.success]
    if rs:
        duration = max((max(r.end_ns for r in rs) - min(r.scheduled_ns for r in rs)) / 1e9, 1e-9)
    else:
        duration = 1e-9
    ms = 1000.0
    return RepeatData(
        duration_s=duration,
        ttft=np.array([r.ttft_s * ms for r in ok]),
        tpot=np.array([(r.tpot_s if r.tpot_s is not None else np.nan) * ms for r in ok]),
        e2el=np.array([r.e2el_s * ms for r in ok]),
        out_tokens=np.array([r.output_tokens for r in ok], dtype=float),
        total_tokens=np.array([r.output_tokens + r.prompt_len for r in ok], dtype=float),
        good=np.array([bool(good_fn(r)) if good_fn else True for r in ok], dtype=float),
        itl=[np.asarray(r.itls_s) * ms for r in ok],
        failed=len(rs) - len(ok),
    )


def _stat(x: np.ndarray, stat: str, axis: int | None = None) -> np.ndarray | float:
    if stat == "mean":
        return np.mean(x, axis=axis)
    if stat == "median":
        return np.median(x, axis=axis)
    return np.percentile(x, float(stat[1:]), axis=axis)


# ITL percentiles over resampled requests use per-request histograms on fine log bins, so a
# bootstrap replicate costs one matrix product instead of concatenating every token.
_ITL_EDGES = np.logspace(-3, 6, 6001)  # 1 us .. 1000 s, 0.35% wide bins


def _itl_hist(itls: list[np.ndarray]) -> np.ndarray:
    h = np.zeros((len(itls), len(_ITL_EDGES) - 1))
    for i, a in enumerate(itls):
        if len(a):
            h[i] = np.histogram(np.clip(a, _ITL_EDGES[0], _ITL_EDGES[-1] * 0.999), bins=_ITL_EDGES)[0]
    return h


def point_value(d: RepeatData, m: MetricDef) -> float:
    """The run-level value of a metric, exactly as computed from all requests."""
    if m.stat == "rate":
        arr = {"out_tokens": d.out_tokens, "total_tokens": d.total_tokens, "good": d.good,
               "requests": np.ones(d.n)}[m.source]
        return float(arr.sum() / d.duration_s)
    if m.source == "itl":
        vals = np.concatenate(d.itl) if d.itl else np.array([])
    else:
        vals = getattr(d, m.source)
        vals = vals[np.isfinite(vals)]
    return float(_stat(vals, m.stat)) if len(vals) else float("nan")


def _bootstrap_repeat(d: RepeatData, m: MetricDef, idx: np.ndarray, hist: np.ndarray | None) -> np.ndarray:
    """B replicate values of a metric for one repeat, given B x n resampled request indices."""
    if m.stat == "rate":
        arr = {"out_tokens": d.out_tokens, "total_tokens": d.total_tokens, "good": d.good,
               "requests": np.ones(d.n)}[m.source]
        return arr[idx].sum(axis=1) / d.duration_s
    if m.source == "itl":
        counts = np.zeros((idx.shape[0], d.n))
        np.add.at(counts, (np.arange(idx.shape[0])[:, None], idx), 1.0)
        if m.stat == "mean":
            sums = np.array([a.sum() for a in d.itl])
            lens = np.array([len(a) for a in d.itl], dtype=float)
            return (counts @ sums) / np.maximum(counts @ lens, 1)
        h = counts @ hist
        cdf = np.cumsum(h, axis=1)
        q = 0.5 if m.stat == "median" else float(m.stat[1:]) / 100.0
        pos = np.array([np.searchsorted(row, q * row[-1]) for row in cdf])
        centers = np.sqrt(_ITL_EDGES[:-1] * _ITL_EDGES[1:])
        return centers[np.minimum(pos, len(centers) - 1)]
    vals = getattr(d, m.source)
    x = vals[idx]
    if np.isnan(x).any():
        x = np.where(np.isnan(x), np.nanmean(vals), x)  # rare: requests with one output token
    return _stat(x, m.stat, axis=1)


def bootstrap_arm(repeats: list[RepeatData], m: MetricDef, b: int, rng: np.random.Generator) -> np.ndarray:
    """B replicates of the arm's metric: resample repeats, then requests within each."""
    per_repeat = []
    for d in repeats:
        if d.n == 0:
            per_repeat.append(np.full(b, np.nan))
            continue
        idx = rng.integers(0, d.n, size=(b, d.n))
        hist = _itl_hist(d.itl) if (m.source == "itl" and m.stat not in ("mean",)) else None
        per_repeat.append(_bootstrap_repeat(d, m, idx, hist))
    v = np.vstack(per_repeat)  # R x B
    r = len(repeats)
    if r == 1:
        return v[0]
    pick = rng.integers(0, r, size=(b, r))
    return np.nanmean(v[pick, np.arange(b)[:, None]], axis=1)


@dataclass
class MetricComparison:
    key: str
    label: str
    higher_is_better: bool
    baseline: float
    candidate: float
    rel_change: float  # candidate / baseline - 1
    ci_low: float
    ci_high: float
    p_value: float | None  # Mann-Whitney U on per-request values (latency metrics)
    verdict: Verdict
    method: str = ""  # "runs": t-interval over repeats; "bootstrap": whole requests of one run
    baseline_runs: list[float] = field(default_factory=list)
    candidate_runs: list[float] = field(default_factory=list)


def _runs_ci(base_runs: list[float], cand_runs: list[float], alpha: float) -> tuple[float, float]:
    """With 2+ repeats per arm, the interval comes from the spread of run-level values: a Welch
    t-interval on the log ratio. Run-level values vary with both the sampling of requests and
    the drift between server starts, so this covers both; a bootstrap of requests alone would
    miss the drift (and throughput, one number per run, has no within-run sample at all)."""
    lb, lc = np.log(np.asarray(base_runs)), np.log(np.asarray(cand_runs))
    if len(lb) < 2 or len(lc) < 2:
        return float("nan"), float("nan")
    vb, vc = lb.var(ddof=1) / len(lb), lc.var(ddof=1) / len(lc)
    diff = lc.mean() - lb.mean()
    se = math.sqrt(vb + vc)
    if se == 0:
        return math.expm1(diff), math.expm1(diff)
    df = (vb + vc) ** 2 / ((vb ** 2 / (len(lb) - 1) if vb else 0) + (vc ** 2 / (len(lc) - 1) if vc else 0))
    t = float(sps.t.ppf(1 - alpha / 2, df))
    return math.expm1(diff - t * se), math.expm1(diff + t * se)


def _per_request(d: RepeatData, source: str) -> np.ndarray:
    if source == "itl":  # one value per request: its mean gap (whole requests, never tokens)
        return np.array([a.mean() for a in d.itl if len(a)])
    v = getattr(d, source)
    return v[np.isfinite(v)]


def compare_metric(base: list[RepeatData], cand: list[RepeatData], m: MetricDef, *, alpha: float = 0.05,
                   b: int = 2000, seed: int = 0) -> MetricComparison:
    rng = np.random.default_rng(seed)
    base_runs = [point_value(d, m) for d in base]
    cand_runs = [point_value(d, m) for d in cand]
    bv, cv = float(np.nanmean(base_runs)), float(np.nanmean(cand_runs))
    if not (np.isfinite(bv) and np.isfinite(cv)) or bv == 0:
        return MetricComparison(m.key, m.label, m.higher_is_better, bv, cv, float("nan"), float("nan"), float("nan"),
                                None, Verdict.NOT_AVAILABLE, "", base_runs, cand_runs)
    if min(len(base), len(cand)) >= 2:
        method = "runs"
        lo, hi = _runs_ci(base_runs, cand_runs, alpha)
    elif m.stat == "rate":  # one run: its duration's noise is unknown
        method, lo, hi = "runs", float("nan"), float("nan")
    else:
        method = "bootstrap"
        rb = bootstrap_arm(base, m, b, rng)
        rc = bootstrap_arm(cand, m, b, rng)
        ratio = rc / rb - 1.0
        ratio = ratio[np.isfinite(ratio)]
        lo, hi = np.percentile(ratio, [100 * alpha / 2, 100 * (1 - alpha / 2)])
    p = None
    if m.stat != "rate":
        xb = np.concatenate([_per_request(d, m.source) for d in base])
        xc = np.concatenate([_per_request(d, m.source) for d in cand])
        if len(xb) and len(xc):
            p = float(sps.mannwhitneyu(xb, xc, alternative="two-sided").pvalue)
    change = cv / bv - 1.0
    if not (np.isfinite(lo) and np.isfinite(hi)):
        verdict = Verdict.NOT_AVAILABLE
    elif lo > 0 or hi < 0:
        improved = (change > 0) == m.higher_is_better
        verdict = Verdict.BETTER if improved else Verdict.WORSE
    else:
        verdict = Verdict.NO_CHANGE
    return MetricComparison(m.key, m.label, m.higher_is_better, bv, cv, change, float(lo), float(hi), p, verdict,
                            method, base_runs, cand_runs)


def compare_arms(base: list[RepeatData], cand: list[RepeatData], percentiles: list[float], *, goodput: bool = False,
                 alpha: float = 0.05, b: int = 2000, seed: int = 0) -> list[MetricComparison]:
    return [compare_metric(base, cand, m, alpha=alpha, b=b, seed=seed + i)
            for i, m in enumerate(metric_defs(percentiles, goodput))]


def noninferiority(base: float, base_se: float, cand: float, cand_se: float, margin: float,
                   alpha: float = 0.05) -> tuple[bool, float, str]:
    """One-sided z-test of H0: cand - base <= -margin against H1: cand - base > -margin.
    Passes when the drop is shown to be smaller than the margin. Returns (pass, z, text)."""
    diff = cand - base
    se = math.sqrt(base_se ** 2 + cand_se ** 2)
    zcrit = float(sps.norm.ppf(1 - alpha))
    if se == 0:
        ok = diff > -margin
        return ok, math.inf if ok else -math.inf, f"diff {diff:+.4f}, no standard error (both exact): pass iff diff > -{margin}"
    z = (diff + margin) / se
    lower = diff - zcrit * se
    return z > zcrit, z, (f"diff {diff:+.4f}, one-sided {100 * (1 - alpha):.0f}% lower bound {lower:+.4f} vs "
                          f"-{margin} (z={z:.2f}, crit {zcrit:.2f})")
