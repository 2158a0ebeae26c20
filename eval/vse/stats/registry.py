"""The metric registry: every metric the suite computes from a run's records, defined once (key as
in vLLM's result JSON, label, direction, the per-request array and statistic it comes from, and the
other views that show it by name). estimate.py computes them; reports, the trend and calibration
read their lists from here."""

from __future__ import annotations

from dataclasses import dataclass

# the scenario's checks need these from a layer below this one
from vse.scenario import FIRST_WAVE_DECODE, MEDIAN_TTFT_FIRST_WAVE, MEDIAN_TTFT_STEADY

# The keys code names by hand (a view's fixed column, a default, a formula): spelled once, here; a
# test scans the package's string literals for any other spelling of a registry key.
OUTPUT_THROUGHPUT = "output_throughput"
TOTAL_TOKEN_THROUGHPUT = "total_token_throughput"
REQUEST_THROUGHPUT = "request_throughput"
REQUEST_GOODPUT = "request_goodput"
MEAN_TTFT = "mean_ttft_ms"
MEDIAN_TTFT = "median_ttft_ms"
MEDIAN_TPOT = "median_tpot_ms"
MEDIAN_ITL = "median_itl_ms"
MEDIAN_ITL_TOKEN = "median_itl_token_ms"
MEAN_ITL_TOKEN = "mean_itl_token_ms"
TMEAN_ITL_TOKEN = "tmean_itl_token_ms"
ENERGY_PER_TOKEN = "energy_per_output_token_mj"
P99_TTFT = "p99_ttft_ms"  # with percentile 99 in the workload (the shipped scenarios have it)
P99_TPOT = "p99_tpot_ms"
# What a user of a new release feels, in the order the release view shows it (analysis/felt.py): the
# gates' three measures, then the whole TTFT and TPOT distributions
FELT = (
    OUTPUT_THROUGHPUT,
    MEDIAN_TTFT_FIRST_WAVE,
    FIRST_WAVE_DECODE,
    MEDIAN_TTFT,
    P99_TTFT,
    MEDIAN_TPOT,
    P99_TPOT,
)


@dataclass(frozen=True)
class MetricDef:
    key: str  # as in vLLM's result JSON, e.g. median_ttft_ms
    label: str
    higher_is_better: bool
    source: str  # per-request array: ttft, tpot, e2el, itl, ttft_first, ttft_steady; or a rate's numerator
    stat: str  # mean, median, pNN, rate
    # Where else it is shown by name: "trend" (the nightly's series), "decode" (a decode measure that
    # every calibration shows beside the gates, each planted step's truth computed for it), "sweep"
    # (a column of the load sweep's table and a curve of its plots), "headline" (in the summary's
    # first line beside the gated metrics, with why its interval is wide where it is).
    views: frozenset[str] = frozenset()


def keys_for(view: str) -> tuple[str, ...]:
    """The metrics a view shows, in the registry's order."""
    return tuple(m.key for m in metric_defs([], False, energy=True) if view in m.views)


# mJ, not J: a GPU spends tens of millijoules per token, which two decimals of joules would round away.
ENERGY = MetricDef(
    ENERGY_PER_TOKEN, "Energy per output token (mJ)", False, "energy_j", "per_token", frozenset({"trend"})
)


def metric_defs(percentiles: list[float], goodput: bool, energy: bool = False) -> list[MetricDef]:
    defs = [
        MetricDef(
            OUTPUT_THROUGHPUT,
            "Output throughput (tok/s)",
            True,
            "out_tokens",
            "rate",
            frozenset({"trend", "sweep", "headline"}),
        ),
        MetricDef(TOTAL_TOKEN_THROUGHPUT, "Total throughput (tok/s)", True, "total_tokens", "rate"),
        MetricDef(REQUEST_THROUGHPUT, "Request throughput (req/s)", True, "requests", "rate"),
    ]
    if goodput:
        defs.append(MetricDef(REQUEST_GOODPUT, "Goodput (req/s)", True, "good", "rate"))
    names = {
        "ttft": "TTFT",
        "tpot": "TPOT",
        "itl": "ITL per chunk",
        "itl_token": "ITL per token",
        "e2el": "E2E latency",
    }
    views = {
        MEDIAN_TPOT: {"trend", "decode", "sweep", "headline"},
        MEDIAN_TTFT: {"headline"},
        MEDIAN_ITL: {"decode", "sweep"},
        MEDIAN_ITL_TOKEN: {"decode"},
        MEAN_ITL_TOKEN: {"decode"},
    }
    for src, name in names.items():
        stats_ = ["mean", "median"] + [f"p{p:g}" for p in percentiles if p != 50]
        for st in stats_:
            label = {"mean": "Mean", "median": "Median"}.get(st, st.upper())
            key = f"{st}_{src}_ms"
            defs.append(MetricDef(key, f"{label} {name} (ms)", False, src, st, frozenset(views.get(key, ()))))
    # Per-token inter-token time, its interdecile mean: the median moves with how the API server
    # packs tokens into chunks, the mean with where prefills fall; the trimmed mean keeps both tails
    # out (exploratory; docs/statistics.md "The decode gate" has the calibration behind it).
    defs.append(
        MetricDef(
            TMEAN_ITL_TOKEN, "Trimmed mean ITL per token (ms)", False, "itl_token", "tmean", frozenset({"decode"})
        )
    )
    # The decode step with nothing else in it (first_wave_decode_ms): no prefill rides along and
    # coalescing only moves a window's two ends.
    defs.append(
        MetricDef(
            FIRST_WAVE_DECODE,
            "Decode per token, first wave (ms)",
            False,
            "decode_first",
            "mean",
            frozenset({"trend", "decode"}),
        )
    )
    # Prefill speed on a bursty closed loop, split so each is stable (README "TTFT"): the first
    # wave of a run hits an idle server all at once; later requests arrive one by one.
    defs.append(
        MetricDef(
            MEDIAN_TTFT_FIRST_WAVE,
            "Median TTFT, first wave (ms)",
            False,
            "ttft_first",
            "median",
            frozenset({"trend", "sweep"}),
        )
    )
    defs.append(MetricDef(MEDIAN_TTFT_STEADY, "Median TTFT, after the first wave (ms)", False, "ttft_steady", "median"))
    if energy:  # only where NVML measured every run (a GPU)
        defs.append(ENERGY)
    keys = [m.key for m in defs]
    if dup := sorted({k for k in keys if keys.count(k) > 1}):
        raise ValueError(f"metric keys defined twice: {', '.join(dup)}")  # one key, one metric, one row
    return defs
