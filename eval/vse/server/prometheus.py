"""The server's own view: scrape vLLM's Prometheus `/metrics` before and after a benchmark and
keep the deltas of its histograms and counters, so a report can show client and server agree."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from vse.rundir.records import REQUESTS_FINISHED, server_mean_key

# Counters and histograms whose before/after difference describes one benchmark repeat.
DELTA_FAMILIES = (
    "vllm:time_to_first_token_seconds",
    "vllm:inter_token_latency_seconds",
    "vllm:e2e_request_latency_seconds",
    "vllm:request_queue_time_seconds",
    "vllm:num_preemptions",
    "vllm:prompt_tokens",
    "vllm:generation_tokens",
    "vllm:request_success",
    "vllm:prefix_cache_queries",
    "vllm:prefix_cache_hits",
    "vllm:iteration_tokens_total",  # tokens per engine step: the M the linear layers ran (eval/vse/gemm/predict.py)
)


# Gauges: only their value at the end (or peak, where sampled) means anything.
GAUGES = ("vllm:kv_cache_usage_perc", "vllm:num_requests_running", "vllm:num_requests_waiting")


def version(base_url: str, timeout: float = 5.0) -> str | None:
    """The server's vLLM version (GET /version), None where it does not say."""
    try:
        with urllib.request.urlopen(base_url.rstrip("/") + "/version", timeout=timeout) as r:
            return str(json.loads(r.read().decode()).get("version") or "") or None
    except (OSError, ValueError, AttributeError):
        return None


def scrape(base_url: str, timeout: float = 10.0) -> dict[str, float]:
    """{sample name (+ significant labels): value}, summed over engines and label sets."""
    with urllib.request.urlopen(base_url.rstrip("/") + "/metrics", timeout=timeout) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            key = s.name
            if "le" in s.labels:
                key += f"{{le={s.labels['le']}}}"
            out[key] = out.get(key, 0.0) + float(s.value)
    return out


def cache_block_size(base_url: str, timeout: float = 10.0) -> int | None:
    """Tokens per KV-cache block (vllm:cache_config_info's block_size label): the prefix cache hits in
    whole blocks of this size. None where the server does not say."""
    try:
        with urllib.request.urlopen(base_url.rstrip("/") + "/metrics", timeout=timeout) as r:
            text = r.read().decode()
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                if s.name.startswith("vllm:cache_config_info") and str(s.labels.get("block_size", "")).isdigit():
                    return int(s.labels["block_size"])
    except (OSError, ValueError):
        return None
    return None


def delta(before: dict[str, float], after: dict[str, float]) -> dict[str, Any]:
    """Differences of counters/histograms; gauges as read after. Also derived means."""
    d: dict[str, Any] = {}
    for k, v in after.items():
        base = k.split("{")[0]
        fam = base.removesuffix("_total").removesuffix("_count").removesuffix("_sum").removesuffix("_bucket")
        if fam in DELTA_FAMILIES or base.removesuffix("_total") in DELTA_FAMILIES:
            d[k] = v - before.get(k, 0.0)
        elif base in GAUGES:
            d[k] = v
    for fam, short in (
        ("vllm:time_to_first_token_seconds", "ttft"),
        ("vllm:inter_token_latency_seconds", "itl"),
        ("vllm:e2e_request_latency_seconds", "e2el"),
    ):
        n, s = d.get(fam + "_count", 0.0), d.get(fam + "_sum", 0.0)
        if n:
            d[server_mean_key(short)] = s / n * 1000.0
            d[f"server_count_{short}"] = n
    return d


def requests_finished(d: dict[str, Any]) -> float:
    return d.get(REQUESTS_FINISHED, 0.0)
