"""Serving metrics from raw request records, with `vllm bench serve`'s definitions, and the
result block in exactly its layout so numbers paste into a PR next to vLLM's own."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.stats as sps

from vse.rundir.rawdata import RepeatResult
from vse.rundir.records import RequestRecord
from vse.scenario import Goodput
from vse.stats import registry

LATENCY_METRICS = ("ttft", "tpot", "itl", "e2el")
# compute's per-request arrays, in vLLM's names and in the order vLLM 0.32's --save-detailed file holds them
PER_REQUEST = (
    "input_lens",
    "output_lens",
    "ttfts",
    "itls",
    "latencies",
    "start_times",
    "queue_times",
    "generated_texts",
    "errors",
)
TRIM = 0.1  # the decode gate's interdecile mean cuts 10% from each end of the per-token times
_TITLES = {
    "ttft": ("TTFT", "Time to First Token"),
    "tpot": ("TPOT", "Time per Output Token (excl. 1st token)"),
    "itl": ("ITL", "Inter-token Latency"),
    "e2el": ("E2EL", "End-to-end Latency"),
}


@dataclass
class Samples:
    """Per-request (and per-chunk, for ITL) values in seconds, from successful measured requests."""

    ttft: list[float] = field(default_factory=list)
    tpot: list[float] = field(default_factory=list)
    itl: list[float] = field(default_factory=list)
    itl_token: list[float] = field(default_factory=list)
    e2el: list[float] = field(default_factory=list)
    queue: list[float] = field(default_factory=list)


def measured(records: list[RequestRecord]) -> list[RequestRecord]:
    return [r for r in records if r.phase == "measure"]


def samples(records: list[RequestRecord]) -> Samples:
    s = Samples()
    for r in measured(records):
        if not r.success:
            continue
        s.ttft.append(r.ttft_s)
        s.e2el.append(r.e2el_s)
        s.itl.extend(r.itls_s)
        s.itl_token.extend(r.itl_tokens_s)
        s.queue.append(r.queue_s)
        if (t := r.tpot_s) is not None:
            s.tpot.append(t)
    return s


def _pct_key(p: float) -> str:
    return str(int(p)) if int(p) == p else str(p)


def statistic(x: np.ndarray, stat: str) -> float:
    """A registry statistic (MetricDef.stat: mean, median, tmean, pNN) of values: the one place it
    is computed, for vLLM's result dictionary and for the run-level values the gates decide on."""
    if stat == "mean":
        return float(np.mean(x))
    if stat == "median":
        return float(np.median(x))
    if stat == "tmean":  # interdecile mean: 10% cut from each end (the decode gate, README "decode gate")
        return float(sps.trim_mean(x, TRIM))
    return float(np.percentile(x, float(stat[1:])))


def summarize(values: list[float], percentiles: list[float]) -> dict[str, float]:
    """vLLM's statistics of one per-request array, in ms. A run without values reads 0 here, as in
    vLLM's bench (its result file has no NaN); the run-level values the gates use read NaN instead."""
    a = np.asarray(values or [0.0]) * 1000.0
    out = {"mean": statistic(a, "mean"), "median": statistic(a, "median"), "std": float(a.std())}
    for p in percentiles:
        out[f"p{_pct_key(p)}"] = statistic(a, f"p{p}")
    return out


@dataclass(frozen=True)
class Peaks:
    """Per one-second bucket from the first send: the suite's peaks (tokens counted per token where
    usage per chunk says how many; concurrency exact, by a sweep over sends and last tokens) and
    vLLM's own (benchmarks/serve.py, calculate_metrics: one token per chunk, a request counted in
    every bucket it touches, which reads up to twice the concurrency limit) for its result file."""

    tokens_per_s: float = 0.0
    concurrent: int = 0
    vllm_tokens_per_s: float = 0.0
    vllm_concurrent: int = 0


def seconds_since(at_ns: list[int], t0_ns: int) -> np.ndarray:
    """Each reading's whole seconds after t0 (int((t - t0) / 1e9), all at once): its one-second bucket."""
    return ((np.array(at_ns, dtype=np.int64) - t0_ns) / 1e9).astype(np.int64)


def per_second(
    records: list[RequestRecord], t0_ns: int, n: int, spread_to_output: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """Tokens and chunks in each of n one-second buckets after t0, from every record's chunks (a
    record without per-chunk counts adds none). spread_to_output scales each request's chunks to add
    up to its exact output: without per-chunk usage a coalesced chunk counts one token."""
    at: list[int] = []
    carried: list[float] = []
    for r in records:
        m = min(len(r.chunk_ns), len(r.chunk_tokens))
        at += r.chunk_ns[:m]
        if spread_to_output:
            scale = r.output_tokens / max(sum(r.chunk_tokens), 1)
            carried += (np.asarray(r.chunk_tokens[:m], dtype=np.float64) * scale).tolist()
        else:
            carried += r.chunk_tokens[:m]
    bucket = seconds_since(at, t0_ns)
    return np.bincount(bucket, weights=np.array(carried, dtype=np.float64), minlength=n), np.bincount(
        bucket, minlength=n
    )


def _peaks(ok: list[RequestRecord]) -> Peaks:
    if not ok:
        return Peaks()
    t0 = min(r.send_ns for r in ok)
    n = int(math.ceil((max(r.end_ns for r in ok) - t0) / 1e9)) + 1
    tokens, chunks = per_second(ok, t0, n)
    # Each request counts in every bucket from its send's to its end's: +1 and -1 summed up
    edges = np.zeros(n + 1, dtype=np.int64)
    np.add.at(edges, seconds_since([r.send_ns for r in ok], t0), 1)
    np.add.at(edges, seconds_since([r.end_ns for r in ok], t0) + 1, -1)
    touching = np.cumsum(edges[:n])
    events = sorted(
        [(r.send_ns, 1) for r in ok] + [((r.chunk_ns[-1] if r.chunk_ns else r.end_ns), -1) for r in ok],
        key=lambda e: (e[0], e[1]),
    )  # an end before a start at the same instant
    live = peak = 0
    for _, d in events:
        live += d
        peak = max(peak, live)
    return Peaks(float(tokens.max()), peak, float(chunks.max()), int(touching.max()))


def good_count(records: list[RequestRecord], goodput: Goodput | None) -> int | None:
    if goodput is None:
        return None
    n = 0
    for r in measured(records):
        if not r.success:
            continue
        checks = [(goodput.ttft_ms, r.ttft_s), (goodput.tpot_ms, r.tpot_s or 0.0), (goodput.e2el_ms, r.e2el_s)]
        if all(slo is None or v * 1000 <= slo for slo, v in checks):
            n += 1
    return n


def compute(
    records: list[RequestRecord],
    percentiles: list[float],
    goodput: Goodput | None = None,
    max_concurrency: int | None = None,
    request_rate: float = math.inf,
) -> dict[str, Any]:
    """The metrics of one benchmark repeat, keyed as `vllm bench serve --save-result` keys them."""
    rs = measured(records)
    ok = [r for r in rs if r.success]
    if rs:
        start = min(r.scheduled_ns for r in rs)
        end = max(r.end_ns for r in rs)
        duration = max((end - start) / 1e9, 1e-9)
    else:
        duration = 1e-9
    # The server's count where it gave one (usage.prompt_tokens, chat template included), as
    # vLLM's bench does; the client tokenizer's otherwise.
    in_lens = [r.usage_prompt_tokens if r.usage_prompt_tokens is not None else r.prompt_len for r in rs]
    total_in = sum(n for n, r in zip(in_lens, rs) if r.success)
    total_out = sum(r.output_tokens for r in ok)
    peaks = _peaks(ok)
    chunks = sum(len(r.chunk_ns) for r in ok)
    good = good_count(records, goodput)
    res: dict[str, Any] = {
        "duration": duration,
        "completed": len(ok),
        "failed": len(rs) - len(ok),
        "max_concurrency": max_concurrency,
        "request_rate": request_rate,
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        registry.REQUEST_THROUGHPUT: len(ok) / duration,
        registry.REQUEST_GOODPUT: (good / duration) if good is not None else None,
        registry.OUTPUT_THROUGHPUT: total_out / duration,
        registry.TOTAL_TOKEN_THROUGHPUT: (total_in + total_out) / duration,
        # the suite's exact peaks under vLLM's names (its block shows them); vLLM's own counts for
        # its result file (report/vllm_files.py puts them under these names there)
        "max_output_tokens_per_s": peaks.tokens_per_s,
        "max_concurrent_requests": peaks.concurrent,
        "vllm_max_output_tokens_per_s": peaks.vllm_tokens_per_s,
        "vllm_max_concurrent_requests": peaks.vllm_concurrent,
        "chunks_per_token": (chunks / total_out) if total_out else None,
        "input_lens": in_lens,
        "output_lens": [r.output_tokens if r.success else 0 for r in rs],
        "ttfts": [r.ttft_s if r.success else 0.0 for r in rs],
        "itls": [r.itls_s if r.success else [] for r in rs],
        "latencies": [r.e2el_s if r.success else 0.0 for r in rs],
        "start_times": [r.send_ns / 1e9 for r in rs],
        "queue_times": [r.queue_s for r in rs],
        "errors": [r.error for r in rs],
        "generated_texts": [r.text for r in rs],  # empty strings unless workload.keep_texts
    }
    s = samples(records)
    for name in LATENCY_METRICS:
        for stat, v in summarize(getattr(s, name), percentiles).items():
            res[f"{stat}_{name}_ms"] = v
    # The suite's own keys beside vLLM's: per-token ITL (records.itl_tokens_s), None where the
    # chunks' token counts are unknown (usage per chunk off).
    for stat, v in summarize(s.itl_token, percentiles).items():
        res[f"{stat}_itl_token_ms"] = v if s.itl_token else None
    res[registry.TMEAN_ITL_TOKEN] = statistic(np.asarray(s.itl_token) * 1000, "tmean") if s.itl_token else None
    for stat, v in summarize(s.queue, percentiles).items():
        res[f"{stat}_client_queue_time_ms"] = v
    return res


def vllm_block(res: dict[str, Any], percentiles: list[float], goodput: bool = False) -> str:
    """The result block of `vllm bench serve`, line for line."""
    L = ["{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=50, c="=")]
    row = lambda k, v, f="": L.append(("{:<40} {:<10" + f + "}").format(k, v))
    row("Successful requests:", res["completed"])
    row("Failed requests:", res["failed"])
    if res.get("max_concurrency") is not None:
        row("Maximum request concurrency:", res["max_concurrency"])
    if res.get("request_rate") not in (None, math.inf, float("inf")):
        row("Request rate configured (RPS):", res["request_rate"], ".2f")
    row("Benchmark duration (s):", res["duration"], ".2f")
    row("Total input tokens:", res["total_input_tokens"])
    row("Total generated tokens:", res["total_output_tokens"])
    row("Request throughput (req/s):", res[registry.REQUEST_THROUGHPUT], ".2f")
    if goodput and res.get(registry.REQUEST_GOODPUT) is not None:
        row("Request goodput (req/s):", res[registry.REQUEST_GOODPUT], ".2f")
    row("Output token throughput (tok/s):", res[registry.OUTPUT_THROUGHPUT], ".2f")
    row("Peak output token throughput (tok/s):", res["max_output_tokens_per_s"], ".2f")
    row("Peak concurrent requests:", res["max_concurrent_requests"], ".2f")
    row("Total token throughput (tok/s):", res[registry.TOTAL_TOKEN_THROUGHPUT], ".2f")
    for name in ("ttft", "tpot", "itl"):
        short, title = _TITLES[name]
        L.append("{s:{c}^{n}}".format(s=title, n=50, c="-"))
        row(f"Mean {short} (ms):", res[f"mean_{name}_ms"], ".2f")
        row(f"Median {short} (ms):", res[f"median_{name}_ms"], ".2f")
        for p in percentiles:
            row(f"P{_pct_key(p)} {short} (ms):", res[f"p{_pct_key(p)}_{name}_ms"], ".2f")
    L.append("=" * 50)
    return "\n".join(L)


def repeat_metrics(r: RepeatResult, w_percentiles: list[float], goodput: Goodput | None = None) -> dict[str, Any]:
    m = r.meta
    rate = m.get("request_rate")
    return compute(r.records, w_percentiles, goodput, m.get("max_concurrency"), math.inf if rate is None else rate)
