"""One benchmark repeat against one live server: scrape /metrics, drive the load, scrape
again, and write the raw records and their settings to the run directory."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

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
from vse.server import prometheus


def shape_of(w: WorkloadSpec, seed: int) -> LoadShape:
    return LoadShape(
        max_concurrency=w.max_concurrency,
        request_rate=w.request_rate,
        burstiness=w.burstiness,
        duration_s=w.duration_s,
        seed=seed,
        stages=tuple(w.stages),
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


@dataclass(frozen=True)
class Target:
    """The live server a run is sent to."""

    url: str
    model: str  # the served model name
    api_key: str | None = None


@dataclass(frozen=True)
class RunPrompts:
    """One run's prompts: the measured ones, the warm-up before them, and what they were made with."""

    measured: list[Prompt]
    sha256: str  # of the saved prompts file, recorded with the run
    tokenizer_path: str | None  # counts output tokens where the server reports none
    warmup: Sequence[Prompt] = ()


def run_repeat(
    target: Target,
    prompts: RunPrompts,
    w: WorkloadSpec,
    out: Path,
    repeat: int,
    *,
    extra_meta: dict | None = None,
    on_done: Callable[[RequestRecord], None] | None = None,
) -> RepeatResult:
    params = RequestParams(
        target.url,
        target.model,
        w.endpoint,
        w.ignore_eos,
        w.temperature,
        w.request_timeout_s,
        w.usage_per_chunk,
        w.read_timeout_s,
        target.api_key,
    )
    count = None
    if prompts.tokenizer_path:
        tok = load_tokenizer(prompts.tokenizer_path)
        count = lambda text: len(tok.encode(text, add_special_tokens=False).ids)
    shape, arm = shape_of(w, seed=repeat), ArmDir(out)
    warm = _warm_up(params, prompts.warmup, shape, count, arm, repeat)
    try:  # after the warm-up, so the server's deltas cover exactly the measured requests
        before = prometheus.scrape(target.url)
    except OSError:
        before = None
    # NVML samples cover exactly the measured load (not the warm-up): energy per token is this run's.
    with GpuSampler(arm.gpu_samples(repeat)) as gpu:
        result = run_load(
            params,
            prompts.measured,
            shape,
            processes=w.client_processes,
            tokenizer_path=prompts.tokenizer_path,
            count_tokens=count,
            on_done=on_done,
        )
    server_delta = None
    if before is not None:
        try:
            server_delta = prometheus.delta(before, prometheus.scrape(target.url))
        except OSError:
            server_delta = None
    meta = {
        "repeat": repeat,
        "base_url": target.url,
        "model": target.model,
        "endpoint": w.endpoint.value,
        "num_prompts": len(prompts.measured),
        "max_concurrency": w.max_concurrency,
        "request_rate": None if math.isinf(w.request_rate) else w.request_rate,
        "burstiness": w.burstiness,
        "warmup_requests": w.warmup_requests,
        "duration_s": w.duration_s,
        "client_processes": result.processes,
        "prompts_sha256": prompts.sha256,
        "loop_lag_ms": result.loop_lag_ms,
        "started_ns": result.started_ns,
        "ended_ns": result.ended_ns,
        # wall clock at the run's end (the ns above are monotonic): vLLM's result file is dated by it
        "ended_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "server_metrics_delta": server_delta,
        # a replayed trace's prefix-cache reuse is estimated in the server's blocks (analysis/replay.py)
        **({"cache_block_size": prometheus.cache_block_size(target.url)} if _replayed(prompts.measured) else {}),
        **({"stages": [st.model_dump() for st in w.stages]} if w.stages else {}),  # bounded by time
        "gpu_telemetry": gpu.telemetry.to_json() if gpu.telemetry else None,
        **(extra_meta or {}),
    }
    _save(arm, repeat, warm, result.records, meta, keep_text=w.keep_texts)
    return RepeatResult(warm + result.records, meta)


def _replayed(prompts: Sequence[Prompt]) -> bool:
    return bool(prompts) and prompts[0].hash_ids is not None


def _warm_up(
    params: RequestParams,
    warmup: Sequence[Prompt],
    shape: LoadShape,
    count: Callable[[str], int] | None,
    arm: ArmDir,
    repeat: int,
) -> list[RequestRecord]:
    """The warm-up requests' records; a server that refused or answered none of them ends the run here,
    its records kept."""
    if not warmup:
        return []
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
    return warm


def _save(
    arm: ArmDir, repeat: int, warm: list[RequestRecord], measured: list[RequestRecord], meta: dict, keep_text: bool
) -> None:
    # Generated text is kept only when asked (workload.keep_texts): at ISL=OSL=1024 it doubles the
    # raw data for nothing a statistic needs (the agreement probe keeps the outputs that matter).
    write_jsonl(arm.records(repeat), warm + measured, keep_text=keep_text)
    write_json(arm.meta(repeat), meta)  # after the records: a run is finished once its meta exists
    run_dir = arm.path.parent
    if RunDir(run_dir).run_json.is_file():  # a run directory's arm (`vse bench` writes to a plain folder)
        counts = {"measured": len(measured), "warmup": len(warm)}
        rel = f"{arm.path.name}/{arm.records(repeat).name}"
        # The GPU samples too: a report computes energy per token from them.
        kept = [arm.records(repeat), arm.meta(repeat)] + [p for p in [arm.gpu_samples(repeat)] if p.is_file()]
        seal.add(run_dir, kept, {rel: counts})
