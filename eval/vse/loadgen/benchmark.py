"""One benchmark repeat against one live server: scrape /metrics, drive the load, scrape
again, and write the raw records and their settings to the run directory."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Callable

from vse.errors import ServerError
from vse.loadgen.client import RequestParams
from vse.loadgen.datasets import Prompt, load_tokenizer
from vse.loadgen.gpu_sampler import GpuSampler
from vse.loadgen.runner import LoadShape, run_load
from vse.rundir import seal
from vse.rundir.files import write_json
from vse.rundir.layout import ArmDir, RunDir
from vse.rundir.rawdata import RepeatResult
from vse.rundir.records import RequestRecord, write_jsonl
from vse.scenario import WorkloadSpec
from vse.server import metrics as server_metrics


def shape_of(w: WorkloadSpec, seed: int) -> LoadShape:
    return LoadShape(
        max_concurrency=w.max_concurrency,
        request_rate=w.request_rate,
        burstiness=w.burstiness,
        duration_s=w.duration_s,
        seed=seed,
    )


AUTH_STATUSES = {401: "unauthorized", 403: "forbidden"}


def refused_every(records: Sequence[RequestRecord]) -> int | None:
    """The HTTP status when the server refused every request for want of credentials, else None."""
    statuses = {r.status for r in records if not r.success}
    if records and all(not r.success for r in records) and len(statuses) == 1 and statuses <= AUTH_STATUSES.keys():
        return statuses.pop()
    return None


def refusal_message(status: int, what: str) -> str:
    return (
        f"the server refused {what} with HTTP {status} ({AUTH_STATUSES[status]}): it wants an API key the client "
        "did not send; name the environment variable that holds it in server.api_key_env"
    )


def run_repeat(
    base_url: str,
    model: str,
    prompts: list[Prompt],
    w: WorkloadSpec,
    out: Path,
    *,
    repeat: int,
    tokenizer_path: str | None,
    prompts_sha: str,
    warmup: Sequence[Prompt] = (),
    extra_meta: dict | None = None,
    on_done: Callable[[RequestRecord], None] | None = None,
    api_key: str | None = None,
) -> RepeatResult:
    params = RequestParams(
        base_url,
        model,
        w.endpoint,
        w.ignore_eos,
        w.temperature,
        w.request_timeout_s,
        w.usage_per_chunk,
        w.read_timeout_s,
        api_key,
    )
    count = None
    if tokenizer_path:
        tok = load_tokenizer(tokenizer_path)
        count = lambda text: len(tok.encode(text, add_special_tokens=False).ids)
    shape, arm = shape_of(w, seed=repeat), ArmDir(out)
    warm: list[RequestRecord] = []
    if warmup:
        warm = run_load(params, list(warmup), shape, phase="warmup", count_tokens=count).records
        if (status := refused_every(warm)) is not None:
            write_jsonl(arm.records(repeat), warm, keep_text=False)
            raise ServerError(refusal_message(status, f"all {len(warm)} warm-up requests of run {repeat + 1}"))
        if all(not r.success and r.error.startswith("timeout") for r in warm):
            write_jsonl(arm.records(repeat), warm, keep_text=False)  # what it saw is kept
            # A server that answers no warm-up request is hung: sending the measured run to it would
            # only wait out the timeout a second time.
            raise ServerError(
                f"server hung: all {len(warm)} warm-up requests of run {repeat + 1} timed out "
                f"({warm[0].error}); the measured run was not sent"
            )
    try:  # after the warm-up, so the server's deltas cover exactly the measured requests
        before = server_metrics.scrape(base_url)
    except OSError:
        before = None
    # NVML samples cover exactly the measured load (not the warm-up): energy per token is this run's.
    with GpuSampler(arm.gpu_samples(repeat)) as gpu:
        result = run_load(
            params,
            prompts,
            shape,
            processes=w.client_processes,
            tokenizer_path=tokenizer_path,
            count_tokens=count,
            on_done=on_done,
        )
    server_delta = None
    if before is not None:
        try:
            server_delta = server_metrics.delta(before, server_metrics.scrape(base_url))
        except OSError:
            server_delta = None
    meta = {
        "repeat": repeat,
        "base_url": base_url,
        "model": model,
        "endpoint": w.endpoint.value,
        "num_prompts": len(prompts),
        "max_concurrency": w.max_concurrency,
        "request_rate": None if math.isinf(w.request_rate) else w.request_rate,
        "burstiness": w.burstiness,
        "warmup_requests": w.warmup_requests,
        "duration_s": w.duration_s,
        "client_processes": result.processes,
        "prompts_sha256": prompts_sha,
        "loop_lag_ms": result.loop_lag_ms,
        "started_ns": result.started_ns,
        "ended_ns": result.ended_ns,
        "server_metrics_delta": server_delta,
        "gpu_telemetry": gpu.telemetry.to_json() if gpu.telemetry else None,
        **(extra_meta or {}),
    }
    # Generated text is not kept: at ISL=OSL=1024 it would double the raw data for nothing
    # a statistic needs (the agreement probe keeps the outputs that matter).
    write_jsonl(arm.records(repeat), warm + result.records, keep_text=False)
    write_json(arm.meta(repeat), meta)  # after the records: a run is finished once its meta exists
    run_dir = arm.path.parent
    if RunDir(run_dir).run_json.is_file():  # a run directory's arm (`vse bench` writes to a plain folder)
        counts = {"measured": len(result.records), "warmup": len(warm)}
        rel = f"{arm.path.name}/{arm.records(repeat).name}"
        # The GPU samples too: a report computes energy per token from them.
        kept = [arm.records(repeat), arm.meta(repeat)] + [p for p in [arm.gpu_samples(repeat)] if p.is_file()]
        seal.add(run_dir, kept, {rel: counts})
    return RepeatResult(warm + result.records, meta)
