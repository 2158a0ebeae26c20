"""The raw record format: one JSON line per request. Every statistic the suite reports is
recomputed from these records, so they hold times, not derived metrics.

All times are `time.monotonic_ns()` of the client process; within one run every client
process shares the machine's monotonic clock, so records from several processes merge.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

RECORD_VERSION = 1


def server_mean_key(short: str) -> str:
    """A run's server-metrics delta (its meta file, written by server/prometheus.delta): the key of a
    vLLM histogram's mean over the repeat, in ms."""
    return f"server_mean_{short}_ms"


# vLLM's own mean inter-token time over a repeat, from the engine core's output timestamps: what the
# client's mean ITL per token is held against (eval/vse/analysis/pace.py).
SERVER_MEAN_ITL = server_mean_key("itl")
# vLLM's own mean TTFT over a repeat: the server's view of a run the disturbed rule lists.
SERVER_MEAN_TTFT = server_mean_key("ttft")
# the delta's count of requests the server finished over a repeat
REQUESTS_FINISHED = "vllm:request_success_total"


@dataclass
class RequestRecord:
    index: int  # position in the prompt list (same across arms: same prompt)
    phase: str  # "warmup" or "measure"
    prompt_len: int
    expected_output_len: int
    scheduled_ns: int  # when the request's arrival came due (rate schedule)
    send_ns: int = 0  # when it got a concurrency slot and was sent (queue time = send - scheduled)
    headers_ns: int = 0  # response headers received
    chunk_ns: list[int] = field(default_factory=list)  # arrival of each chunk carrying output tokens
    chunk_tokens: list[int] = field(default_factory=list)  # output tokens in each such chunk
    end_ns: int = 0  # stream finished ([DONE] or EOF); the run's duration ends here
    output_tokens: int = 0  # per server usage when given, else tokenizer/chunk count
    usage_prompt_tokens: int | None = None
    usage_completion_tokens: int | None = None
    token_source: str = "usage"  # "usage", "tokenizer" or "chunks"
    # Whether every output chunk carried the server's usage count (continuous usage stats), so
    # chunk_tokens is the server's and not one token a chunk assumed. None: a record from before the
    # suite kept this (rawdata.load_repeats decides it from the run's workload.usage_per_chunk).
    chunk_usage: bool | None = None
    success: bool = False
    error: str = ""
    status: int = 0
    worker: int = 0
    text: str = ""
    stage: int | None = None  # a staged load's stage (workload.stages) the request was sent in
    session: int | None = None  # a sessions run's session and turn (0-based) this request was
    turn: int | None = None

    @property
    def ttft_s(self) -> float:
        return (self.chunk_ns[0] - self.send_ns) / 1e9

    @property
    def e2el_s(self) -> float:
        """Send to last output token, as `vllm bench serve` defines latency (so TPOT matches)."""
        return ((self.chunk_ns[-1] if self.chunk_ns else self.end_ns) - self.send_ns) / 1e9

    @property
    def queue_s(self) -> float:
        return max(0, self.send_ns - self.scheduled_ns) / 1e9

    @property
    def itls_s(self) -> list[float]:
        return (np.diff(np.asarray(self.chunk_ns, dtype=np.int64)) / 1e9).tolist()

    def _delivery_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """(arrival ns, tokens) per delivery as arrays: chunks from the first one carrying tokens on,
        consecutive chunks of one arrival time summed (chunk_ns is in arrival order: _checked)."""
        n = min(len(self.chunk_ns), len(self.chunk_tokens))  # a record without per-chunk counts has none
        k = np.asarray(self.chunk_tokens[:n], dtype=np.int64)
        first = np.flatnonzero(k > 0)
        if not first.size:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        c, k = np.asarray(self.chunk_ns[first[0] : n], dtype=np.int64), k[first[0] :]
        starts = np.flatnonzero(np.r_[True, c[1:] != c[:-1]])
        return c[starts], np.add.reduceat(k, starts)

    @property
    def deliveries(self) -> list[tuple[int, int]]:
        """(arrival ns, tokens) of what arrived at each instant: chunks read from the socket at once
        are one delivery (their tokens were all produced by then, however late the first of them),
        and chat's tokenless opening chunk is none."""
        times, tokens = self._delivery_arrays()
        return list(zip(times.tolist(), tokens.tolist()))

    @property
    def itl_tokens_s(self) -> list[float]:
        """Per-token inter-token times: each delivery's gap spread evenly over the tokens it carried,
        so k tokens arriving g after the previous ones give k values of g / k. A delivery is what
        arrived at one instant: one SSE chunk, or several chunks read from the socket at once (an API
        server that fell behind flushes several steps together; each then has a gap of 0, which is
        not a token's time). Exact only when each chunk's token count came from the server
        for every chunk (continuous usage stats: workload.usage_per_chunk; chunk_usage) and they add up
        to the request's output; otherwise empty (unknown, not guessed: a request that happened not to
        coalesce would be kept and one that did dropped, a choice that follows the arm's speed). Intervals start at the first token: chat's
        role-only opening chunk is no interval."""
        if (
            self.chunk_usage is not True
            or self.token_source != "usage"
            or not self.output_tokens
            or sum(self.chunk_tokens) != self.output_tokens
        ):
            return []
        times, tokens = self._delivery_arrays()
        # A tokenless delivery's gap goes to the next token's: gaps run between deliveries with
        # tokens (the first delivery always has some). Integer ns below 2**53 make each value the
        # same float as gap / k / 1e9 in Python.
        with_tokens = np.flatnonzero(tokens > 0)
        k = tokens[with_tokens[1:]]
        return np.repeat(np.diff(times[with_tokens]) / k / 1e9, k).tolist()

    @property
    def tpot_s(self) -> float | None:
        """vLLM's definition: (E2E - TTFT) / (output tokens - 1), the first token excluded."""
        if self.output_tokens <= 1:
            return None
        return (self.e2el_s - self.ttft_s) / (self.output_tokens - 1)


OPTIONAL = ("stage", "session", "turn")


def write_jsonl(path: Path, records: Iterable[RequestRecord], keep_text: bool = True) -> None:
    from vse.rundir.files import atomic_write_text

    lines = []
    for r in records:
        d = asdict(r)
        if not keep_text:
            d["text"] = ""
        for (
            key
        ) in OPTIONAL:  # only a staged load's or sessions run's records have these: other runs' files stay as they were
            if d[key] is None:
                del d[key]
        lines.append(json.dumps(d, separators=(",", ":")))
    atomic_write_text(path, "\n".join(lines) + ("\n" if lines else ""))


def read_jsonl(path: Path) -> list[RequestRecord]:
    """Every record of a run; a line that is not one (a truncated file, a stray edit) is refused
    with the file and line named: a record silently lost would move every figure."""
    from vse.errors import DamagedRunError

    out = []
    try:
        with open(path, encoding="utf-8", errors="strict") as f:
            for n, line in enumerate(f, 1):
                if line.strip():
                    try:
                        out.append(_checked(RequestRecord(**json.loads(line))))
                    except (ValueError, TypeError) as e:
                        raise DamagedRunError(
                            f"{path}: line {n} is not a request record ({str(e)[:120]}); the run directory is damaged"
                        ) from None
    except OSError as e:
        raise DamagedRunError(f"{path}: cannot be read ({e.strerror}); the run directory is damaged") from None
    except UnicodeDecodeError as e:
        raise DamagedRunError(f"{path}: not UTF-8 text (at byte {e.start}); the run directory is damaged") from None
    return out


_TIMES = ("scheduled_ns", "send_ns", "headers_ns", "end_ns")


def _checked(r: RequestRecord) -> RequestRecord:
    """A record's clock readings are whole, non-negative nanoseconds, its chunks in arrival order
    after the send: anything else (NaN, a negative latency, an edit) cannot have been measured."""
    for name in _TIMES:
        v = getattr(r, name)
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise ValueError(f"{name} is {v!r}, not a clock reading")
    # Whole lists at C speed (a run holds millions of chunks): JSON gives exact types, so
    # `type is int` is isinstance(int) without bool, and a sorted list equals itself sorted.
    c, k = r.chunk_ns, r.chunk_tokens
    if not set(map(type, c)) <= {int}:
        raise ValueError("chunk_ns holds a value that is not a clock reading")
    if c and (c[0] < r.send_ns or c != sorted(c)):
        raise ValueError("chunk_ns is not in arrival order after the send (a negative latency)")
    if len(k) not in (0, len(c)) or not set(map(type, k)) <= {int, bool} or (k and min(k) < 0):
        raise ValueError("chunk_tokens does not match chunk_ns")
    return r


@dataclass
class AccuracyResult:
    """Scores keyed "task/metric,filter" with their standard errors, from lm-eval's JSON."""

    scores: dict[str, float] = field(default_factory=dict)
    stderrs: dict[str, float] = field(default_factory=dict)
    samples: dict[str, dict[str, int]] = field(default_factory=dict)  # task -> original/effective
    versions: dict[str, Any] = field(default_factory=dict)
    num_fewshot: dict[str, Any] = field(default_factory=dict)
    table: str = ""
    raw_path: str = ""
    # "task/metric,filter" -> {question id: 1 right, 0 wrong}, from lm-eval's logged samples:
    # both arms answer the same questions, so the comparison can be paired.
    per_question: dict[str, dict[str, int]] = field(default_factory=dict)
    subset: str = ""  # how the questions were chosen when limit is set
