"""A request trace read for replay: the requests of the window a scenario replays, when each is due
and the lengths it is sent with. Read when the scenario is loaded, so that a bad line ends in one
line naming the file, the line and the problem before any server starts (`vse check` too).

A format is one reader in FORMATS: a function from one parsed JSON line to a TraceRow. Adding a
format is a TraceFormat member and its reader here (docs/scenarios.md, "Replaying a trace")."""

from __future__ import annotations

import gzip
import json
import math
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from vse.errors import ScenarioError
from vse.scenario import DatasetSpec, LengthPolicy, TraceFormat, TraceSpec


@dataclass(frozen=True)
class TraceRow:
    """One request as the trace has it."""

    line: int
    timestamp_s: float
    input_len: int
    output_len: int
    hash_ids: tuple[int, ...]  # one per block of block_tokens tokens: equal ids, equal prefix blocks


@dataclass(frozen=True)
class TraceRequest:
    """One request as it is replayed."""

    line: int  # in the trace file (1-based)
    arrival_s: float  # from the window's start, after time_scale
    input_len: int  # tokens, after length_scale and the length policy
    output_len: int
    hash_ids: tuple[int, ...]  # the blocks it is sent with (a capped prompt keeps its leading ones)


@dataclass(frozen=True)
class TraceWindow:
    path: str
    requests: list[TraceRequest]
    block_len: int  # tokens per block as sent
    in_window: int  # requests the window held before any was dropped
    scaled: int  # requests whose lengths length_scale changed
    capped: int  # requests the cap policy shortened
    dropped: int  # requests the drop policy left out
    trace_span_s: tuple[float, float]  # the whole trace's first and last timestamp


def _mooncake(row: dict[str, Any], where: str) -> tuple[float, int, int, tuple[int, ...]]:
    for key in ("timestamp", "input_length", "output_length", "hash_ids"):
        if key not in row:
            raise ScenarioError(
                f"{where}: no {key!r} (Mooncake's lines have timestamp, input_length, output_length, hash_ids)"
            )
    ts, n_in, n_out, ids = row["timestamp"], row["input_length"], row["output_length"], row["hash_ids"]
    if not isinstance(ts, (int, float)) or isinstance(ts, bool) or not math.isfinite(ts) or ts < 0:
        raise ScenarioError(f"{where}: timestamp {ts!r} is not a number of milliseconds >= 0")
    for key, v in (("input_length", n_in), ("output_length", n_out)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ScenarioError(f"{where}: {key} {v!r} is not a whole number of tokens >= 1")
    if not isinstance(ids, list) or not all(isinstance(h, int) and not isinstance(h, bool) and h >= 0 for h in ids):
        raise ScenarioError(f"{where}: hash_ids is not a list of whole numbers >= 0")
    return ts / 1000.0, n_in, n_out, tuple(ids)


FORMATS: dict[TraceFormat, Callable[[dict[str, Any], str], tuple[float, int, int, tuple[int, ...]]]] = {
    TraceFormat.MOONCAKE: _mooncake,
}


def read_rows(path: str, fmt: TraceFormat, block_tokens: int) -> list[TraceRow]:
    """Every request of the file, checked: parseable, complete, in time order, one hash per block."""
    return list(_read_rows(path, os.stat(path).st_mtime_ns, fmt, block_tokens))


def json_objects(path: str) -> Iterator[tuple[int, str, dict[str, Any]]]:
    """(line number, "file:line", the object) for each line of a JSONL file (gzip where it ends in
    .gz), blank lines skipped; a line that is not a JSON object is one error naming it."""
    with (gzip.open if path.endswith(".gz") else open)(path, "rt", encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{n}"
            try:
                data = json.loads(line)
            except json.JSONDecodeError as e:
                raise ScenarioError(f"{where}: not JSON ({e.msg} at column {e.colno})") from None
            if not isinstance(data, dict):
                raise ScenarioError(f"{where}: not a JSON object")
            yield n, where, data


@lru_cache(maxsize=4)
def _read_rows(path: str, _mtime: int, fmt: TraceFormat, block_tokens: int) -> tuple[TraceRow, ...]:
    reader = FORMATS[fmt]
    rows: list[TraceRow] = []
    for n, where, data in json_objects(path):
        ts, n_in, n_out, ids = reader(data, where)
        if rows and ts < rows[-1].timestamp_s:
            raise ScenarioError(
                f"{where}: timestamp {ts * 1000:g} ms goes back from {rows[-1].timestamp_s * 1000:g} ms "
                f"on line {rows[-1].line}; a trace is replayed in time order"
            )
        if len(ids) != -(-n_in // block_tokens):
            raise ScenarioError(
                f"{where}: {len(ids)} hash_ids for {n_in} input tokens; blocks of {block_tokens} tokens "
                f"need {-(-n_in // block_tokens)} (workload.dataset.trace.block_tokens)"
            )
        rows.append(TraceRow(n, ts, n_in, n_out, ids))
    if not rows:
        raise ScenarioError(f"{path}: the trace has no request")
    return tuple(rows)


def _fit(r: TraceRow, t: TraceSpec, block: int) -> tuple[int, int, tuple[int, ...]]:
    """Its lengths after length_scale, kept within the blocks its hashes name."""
    k = len(r.hash_ids)
    n_in = min(max(math.ceil(r.input_len * t.length_scale), (k - 1) * block + 1), k * block)
    n_out = max(1, round(r.output_len * t.length_scale))
    return n_in, n_out, r.hash_ids


def window(spec: DatasetSpec) -> TraceWindow:
    """The requests a scenario replays: the window's, at their lengths and pace, or one line why not."""
    t, path = spec.replay, str(spec.path)
    rows = read_rows(path, t.format, t.block_tokens)
    end = t.start_s + t.duration_s if t.duration_s is not None else math.inf
    inside = [r for r in rows if t.start_s <= r.timestamp_s < end]
    span = (rows[0].timestamp_s, rows[-1].timestamp_s)
    if not inside:
        to = f"{end:g} s" if math.isfinite(end) else "the end"
        raise ScenarioError(
            f"{path}: the window {t.start_s:g} s to {to} holds no request "
            f"(the trace spans {span[0]:g}-{span[1]:g} s; workload.dataset.trace.start_s, duration_s)"
        )
    block = t.block_len
    # One token below max_len: a tokenizer that adds a BOS token sends the prompt one token longer.
    limit = t.max_len - 1 if t.max_len is not None else None
    if limit is not None and block >= limit:
        raise ScenarioError(
            f"{path}: a block of {block} tokens does not fit max_len {t.max_len}; lower workload.dataset.trace.length_scale"
        )
    out: list[TraceRequest] = []
    scaled = capped = dropped = 0
    for r in inside:
        n_in, n_out, ids = _fit(r, t, block)
        scaled += (n_in, n_out) != (r.input_len, r.output_len)
        if limit is not None and n_in + n_out > limit:
            if t.length_policy == LengthPolicy.ERROR:
                raise ScenarioError(
                    f"{path}:{r.line}: {n_in} + {n_out} tokens (after length_scale {t.length_scale:g}) do not fit "
                    f"max_len {t.max_len} (one token kept for a BOS); set workload.dataset.trace.length_policy "
                    "to cap or drop, or lower length_scale"
                )
            if t.length_policy == LengthPolicy.DROP:
                dropped += 1
                continue
            capped += 1
            if n_in >= limit:  # the prompt alone: its leading whole blocks, room for one output token
                keep = (limit - 1) // block
                n_in, ids = keep * block, ids[:keep]
            n_out = min(n_out, limit - n_in)
        offset = (r.timestamp_s - t.start_s) * t.time_scale
        out.append(TraceRequest(r.line, offset, n_in, n_out, ids))
    if not out:
        raise ScenarioError(
            f"{path}: every request of the window was dropped (length_policy drop, max_len {t.max_len})"
        )
    return TraceWindow(path, out, block, len(inside), scaled, capped, dropped, span)


def resolve(
    where: Path, spec: DatasetSpec, num_prompts: int | None, warmup: int, max_model_len: int | None
) -> tuple[DatasetSpec, int]:
    """The dataset with max_len filled from the server's context, and the number of requests to
    replay (the window's, or num_prompts where the scenario sets it and the window holds as many)."""
    t = spec.replay
    if t.max_len is None and max_model_len is not None:
        t = t.model_copy(update={"max_len": max_model_len})
    if t.length_policy != LengthPolicy.ERROR and t.max_len is None:
        raise ScenarioError(
            f"{where}: workload.dataset.trace.length_policy {t.length_policy.value} needs a context: "
            "set server.max_model_len or workload.dataset.trace.max_len"
        )
    spec = spec.model_copy(update={"trace": t})
    w = window(spec)
    n = len(w.requests) if num_prompts is None else num_prompts
    if n > len(w.requests):
        raise ScenarioError(
            f"{where}: workload.num_prompts is {n}, but the trace's window holds {len(w.requests)} requests "
            f"({spec.path}); leave num_prompts out to replay the whole window"
        )
    if warmup > len(w.requests):
        raise ScenarioError(
            f"{where}: workload.warmup_requests {warmup} is more than the window's {len(w.requests)} requests"
        )
    return spec, n
