"""Drives load: arrival schedule (request rate with gamma burstiness, vLLM's semantics),
max concurrency (a semaphore, with the wait recorded as client queue time), a warm-up phase
kept out of statistics, a duration cap, event-loop lag measurement, and several client
processes when one event loop cannot keep up."""

from __future__ import annotations

import asyncio
import contextlib
import math
import multiprocessing
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace

import numpy as np

from vse.loadgen.client import RequestParams, make_session, stream_request
from vse.loadgen.datasets import Prompt
from vse.rundir.records import RequestRecord
from vse.scenario import Stage


@dataclass(frozen=True)
class LoadShape:
    max_concurrency: int | None = None
    request_rate: float = math.inf
    burstiness: float = 1.0
    duration_s: float | None = None
    seed: int = 0
    stages: tuple[Stage, ...] = ()  # a staged load (workload.stages): these, in order, instead of the above


@dataclass
class LoadResult:
    records: list[RequestRecord]
    loop_lag_ms: dict[str, float] = field(default_factory=dict)  # p50 / p99 / max, per process max
    processes: int = 1
    started_ns: int = 0
    ended_ns: int = 0


def arrival_offsets(n: int, rate: float, burstiness: float, seed: int) -> np.ndarray:
    """Seconds from start at which each request comes due. Gamma-distributed gaps with mean
    1/rate and shape `burstiness` (1.0 = Poisson), as `vllm bench serve` draws them."""
    if math.isinf(rate):
        return np.zeros(n)
    rng = np.random.default_rng(seed)
    gaps = rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=n)
    gaps[0] = 0.0
    return np.cumsum(gaps)


def schedule(prompts: list[Prompt], shape: LoadShape) -> np.ndarray:
    """When each measured request comes due: a replayed trace's own arrival times, else the rate's."""
    if prompts and all(p.arrival_s is not None for p in prompts):
        return np.asarray([p.arrival_s for p in prompts], dtype=float)
    return arrival_offsets(len(prompts), shape.request_rate, shape.burstiness, shape.seed)


class _LagMonitor:
    """How late the event loop wakes up: if it is busy, timestamps are late too."""

    def __init__(self, interval_s: float = 0.005) -> None:
        self.interval = interval_s
        self.lags: list[float] = []
        self._task: asyncio.Task | None = None

    async def _run(self) -> None:
        while True:
            t = time.monotonic()
            await asyncio.sleep(self.interval)
            self.lags.append(max(0.0, time.monotonic() - t - self.interval) * 1e3)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> dict[str, float]:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if not self.lags:
            return {}
        a = np.asarray(self.lags)
        return {"p50": float(np.median(a)), "p99": float(np.percentile(a, 99)), "max": float(a.max())}


async def _sleep_until(deadline_ns: int) -> None:
    """Never wake early: uvloop's timers have millisecond granularity and may fire a little
    before the deadline, which would send a request before its scheduled time."""
    while (left := deadline_ns - time.monotonic_ns()) > 0:
        await asyncio.sleep(left / 1e9)


async def _send(
    session,
    params: RequestParams,
    text: str,
    rec: RequestRecord,
    count_tokens,
    on_done: Callable[[RequestRecord], None] | None,
    slot: contextlib.AbstractAsyncContextManager | None = None,
) -> None:
    """One request into `rec`, inside `slot` (a concurrency limit's semaphore) where there is one."""
    async with slot or contextlib.nullcontext():
        await stream_request(session, params, text, rec.expected_output_len, rec, count_tokens)
    if on_done:
        on_done(rec)


async def _run_phase(
    session,
    params: RequestParams,
    prompts: list[Prompt],
    phase: str,
    shape: LoadShape,
    count_tokens,
    on_done: Callable[[RequestRecord], None] | None,
    worker: int,
    t0_ns: int | None = None,
) -> list[RequestRecord]:
    sem = asyncio.Semaphore(shape.max_concurrency) if shape.max_concurrency else contextlib.nullcontext()
    offsets = schedule(prompts, shape) if phase == "measure" else np.zeros(len(prompts))
    start_ns = t0_ns or time.monotonic_ns()
    deadline_ns = start_ns + int(shape.duration_s * 1e9) if shape.duration_s and phase == "measure" else None
    records: list[RequestRecord] = []

    async def one(p: Prompt, due_ns: int) -> None:
        rec = RequestRecord(
            index=p.index,
            phase=phase,
            prompt_len=p.prompt_len,
            expected_output_len=p.output_len,
            scheduled_ns=due_ns,
            worker=worker,
        )
        records.append(rec)
        await _send(session, params, p.text, rec, count_tokens, on_done, sem)

    tasks = []
    for p, off in zip(prompts, offsets):
        due = start_ns + int(off * 1e9)
        if deadline_ns and due >= deadline_ns:
            break
        await _sleep_until(due)
        tasks.append(asyncio.create_task(one(p, max(due, start_ns))))
    if tasks:
        await asyncio.gather(*tasks)
    return records


async def _run_stages(
    session,
    params: RequestParams,
    prompts: list[Prompt],
    shape: LoadShape,
    count_tokens,
    on_done: Callable[[RequestRecord], None] | None,
) -> list[RequestRecord]:
    """Each stage in turn from the moment the previous one's time is up: a rate stage sends at its
    rate, a concurrency stage keeps that many in flight, sending the next prompt as one finishes.
    No request starts after its stage's end; one still in flight then finishes in the next stage's
    time and keeps its own stage. The prompts are taken in order; none left, the load stops."""
    pending = iter(prompts)
    records: list[RequestRecord] = []
    tasks: list[asyncio.Task] = []

    async def one(p: Prompt, due_ns: int, stage: int) -> None:
        rec = RequestRecord(p.index, "measure", p.prompt_len, p.output_len, scheduled_ns=due_ns, stage=stage)
        records.append(rec)
        await _send(session, params, p.text, rec, count_tokens, on_done)

    async def keep_busy(stage: int, end_ns: int) -> None:
        while time.monotonic_ns() < end_ns and (p := next(pending, None)) is not None:
            await one(p, time.monotonic_ns(), stage)

    start_ns = time.monotonic_ns()
    for i, st in enumerate(shape.stages):
        end_ns = start_ns + int(st.duration_s * 1e9)
        if st.max_concurrency is not None:
            tasks += [asyncio.create_task(keep_busy(i, end_ns)) for _ in range(st.max_concurrency)]
        else:
            rate = st.request_rate or math.inf
            n = int(rate * st.duration_s * 2) + 16  # more gaps than the stage can use
            for off in arrival_offsets(n, rate, shape.burstiness, shape.seed + i):
                due = start_ns + int(off * 1e9)
                if due >= end_ns:
                    break
                await _sleep_until(due)
                if (p := next(pending, None)) is None:
                    break
                tasks.append(asyncio.create_task(one(p, due, i)))
        await _sleep_until(end_ns)
        start_ns = end_ns
    if tasks:
        await asyncio.gather(*tasks)
    return records


def _not_sent(p: Prompt, why: str) -> RequestRecord:
    now = time.monotonic_ns()
    rec = RequestRecord(
        p.index, "measure", p.prompt_len, p.output_len, scheduled_ns=now, send_ns=now, session=p.session, turn=p.turn
    )
    rec.end_ns, rec.error = now, why
    return rec


async def _run_sessions(
    session,
    params: RequestParams,
    prompts: list[Prompt],
    shape: LoadShape,
    count_tokens,
    on_done: Callable[[RequestRecord], None] | None,
) -> list[RequestRecord]:
    """Each session as a chat client runs it: from its start, a turn, its answer in full, the user's
    think time, the next turn with every earlier turn and answer before it. workload.max_concurrency
    caps the requests in flight over all sessions. A failed turn ends its session: its later turns
    are recorded as failed, not sent (they would have no answer to follow)."""
    sem = asyncio.Semaphore(shape.max_concurrency) if shape.max_concurrency else contextlib.nullcontext()
    records: list[RequestRecord] = []
    by: dict[int, list[Prompt]] = {}
    for p in prompts:
        by.setdefault(p.session or 0, []).append(p)
    t0 = time.monotonic_ns()

    async def run_one(turns: list[Prompt]) -> None:
        await _sleep_until(t0 + int((turns[0].arrival_s or 0.0) * 1e9))
        history, sent = "", 0
        turns = sorted(turns, key=lambda q: q.turn or 0)
        for j, p in enumerate(turns):
            if sent:
                await asyncio.sleep(p.think_s or 0.0)
            text = history + p.text
            n_in = count_tokens(text) if count_tokens else p.prompt_len + sent
            rec = RequestRecord(
                p.index, "measure", n_in, p.output_len, scheduled_ns=time.monotonic_ns(), session=p.session, turn=p.turn
            )
            records.append(rec)
            await _send(session, params, text, rec, count_tokens, on_done, sem)
            if not rec.success:
                records.extend(_not_sent(q, f"not sent: turn {p.turn} of its session failed") for q in turns[j + 1 :])
                return
            history, sent = text + rec.text, (rec.usage_prompt_tokens or n_in) + rec.output_tokens

    await asyncio.gather(*(run_one(t) for t in by.values()))
    return records


async def run_load_async(
    params: RequestParams,
    prompts: list[Prompt],
    shape: LoadShape,
    *,
    phase: str = "measure",
    count_tokens=None,
    on_done: Callable[[RequestRecord], None] | None = None,
    worker: int = 0,
    t0_ns: int | None = None,
) -> LoadResult:
    if phase == "warmup":  # all at once, never capped: it only has to warm the server
        shape = replace(shape, request_rate=math.inf, duration_s=None)
    concurrency = shape.max_concurrency or len(prompts)
    async with make_session(concurrency) as session:
        lag = _LagMonitor()
        lag.start()
        started = time.monotonic_ns()
        if t0_ns:
            await _sleep_until(t0_ns)
        if shape.stages and phase == "measure":
            records = await _run_stages(session, params, prompts, shape, count_tokens, on_done)
        elif phase == "measure" and prompts and prompts[0].session is not None:
            records = await _run_sessions(session, params, prompts, shape, count_tokens, on_done)
        else:
            records = await _run_phase(session, params, prompts, phase, shape, count_tokens, on_done, worker, t0_ns)
        ended = time.monotonic_ns()
        lags = await lag.stop()
    return LoadResult(records, lags, 1, t0_ns or started, ended)


def _run(coro):
    """uvloop where installed: its event loop wakes and dispatches reads with less overhead, so
    arrival timestamps sit closer to the bytes' arrival (see benchmarks/client_accuracy.py)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def _worker_main(args) -> LoadResult:
    params, prompts, shape, phase, worker, t0_ns, tokenizer_path = args
    count = None
    if tokenizer_path:
        from vse.loadgen.datasets import load_tokenizer

        tok = load_tokenizer(tokenizer_path)
        count = lambda text: len(tok.encode(text, add_special_tokens=False).ids)
    return _run(run_load_async(params, prompts, shape, phase=phase, count_tokens=count, worker=worker, t0_ns=t0_ns))


def share(total: int, n: int, i: int) -> int:
    """Worker i's part of a concurrency limit: the parts add up to the limit (10 over 3 workers
    is 4, 3, 3; a floor division would run 9 while the scenario says 10)."""
    return max(1, total // n + (1 if i < total % n else 0))


def run_load(
    params: RequestParams,
    prompts: list[Prompt],
    shape: LoadShape,
    *,
    phase: str = "measure",
    processes: int = 1,
    tokenizer_path: str | None = None,
    count_tokens=None,
    on_done: Callable[[RequestRecord], None] | None = None,
) -> LoadResult:
    """Run one phase (warm-up or measured). With processes > 1, prompts are dealt round-robin
    to that many client processes, each with its share of concurrency and rate, started on
    one shared monotonic instant; their records merge into one result."""
    if processes <= 1 or len(prompts) < processes:
        return _run(run_load_async(params, prompts, shape, phase=phase, count_tokens=count_tokens, on_done=on_done))
    n = processes
    rate = shape.request_rate / n
    t0 = time.monotonic_ns() + int(3e9)  # time for the workers to start
    # Worker i starts its schedule i gaps of the whole rate late: n constant-rate schedules then
    # interleave into the one the scenario asks for, instead of n requests due at each instant.
    # A trace's prompts carry their own times, and an unlimited rate has no gap.
    own_times = any(p.arrival_s is not None for p in prompts)
    gap_ns = 0 if own_times or math.isinf(shape.request_rate) else int(1e9 / shape.request_rate)
    jobs = [
        (
            params,
            prompts[i::n],
            replace(
                shape,
                max_concurrency=share(shape.max_concurrency or len(prompts), n, i),
                request_rate=rate,
                seed=shape.seed + i,
            ),
            phase,
            i,
            t0 + i * gap_ns,
            tokenizer_path,
        )
        for i in range(n)
    ]
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=n, mp_context=ctx) as pool:
        parts = list(pool.map(_worker_main, jobs))
    records = sorted((r for p in parts for r in p.records), key=lambda r: r.scheduled_ns)
    lag = {k: max(p.loop_lag_ms.get(k, 0.0) for p in parts) for k in ("p50", "p99", "max")}
    return LoadResult(records, lag, n, t0, max(p.ended_ns for p in parts))
