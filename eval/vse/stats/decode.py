"""The decode step measured where nothing else runs: the first wave's pure decode phase."""

from __future__ import annotations

import numpy as np

from vse.rundir.records import RequestRecord

MIN_WINDOW_TOKENS = 32  # fewer tokens in the window: its two ends' jitter would dominate
# Fewer deliveries per token inside the window: a typical delivery carried two tokens or more, so the
# API server wrote each stream at most every other engine step through the whole window, behind the
# engine. Its backlog then times the window's two ends, and on a real server it does not stay put
# (docs/measurements.md, "Engine or API server: whose pace the client reads").
MIN_DELIVERIES_PER_TOKEN = 0.5
KEEP_UP = (
    "more API-server processes (server.extra_args: [--api-server-count, N]) or fewer streams "
    "(workload.max_concurrency) let it keep up"
)


def first_wave_decode_ms(wave: list[RequestRecord]) -> np.ndarray:
    """Per request of the first wave, milliseconds per token while the wave decodes alone (empty:
    `first_wave_decode` says why)."""
    return first_wave_decode(wave)[0]


def first_wave_decode(wave: list[RequestRecord]) -> tuple[np.ndarray, str]:
    """Per request of the first wave, milliseconds per token while the wave decodes alone, or no
    values and the reason.

    In a closed loop the first wave's prompts are all prefilled at the start (the last first token
    marks the end of the last prefill) and no new request is sent until one of them completes, so
    between those two instants every engine step is a pure decode step of the whole wave: no
    prefill rides along, whatever the arm's speed. Within that window a request's time per token is
    (last delivery - first delivery) / (tokens between them, by the server's per-chunk counts):
    packing several tokens into a chunk moves only the two end points, by a step or so of a
    window of hundreds, while the API server keeps up with the engine; where it stays behind
    through the window (MIN_DELIVERIES_PER_TOKEN) its varying backlog times the ends, and the run
    has no value. A delivery is what arrived at one instant (RequestRecord.deliveries):
    chunks read from the socket together count from the time they arrived, all of them, or the
    tokens of the later ones would count without their time."""
    why = _unusable(wave)
    if why:
        return np.array([]), why
    out, pace = _window(wave)
    if len(out) < len(wave):
        return np.array([]), (
            f"the pure-decode window held fewer than {MIN_WINDOW_TOKENS} tokens for a first-wave request "
            "(short or mixed output lengths, or EOS before the wave was prefilled)"
        )
    if pace < MIN_DELIVERIES_PER_TOKEN:
        return np.array([]), (
            f"the API server fell behind the engine through the first wave's pure-decode window "
            f"({pace:.2f} deliveries per token, below {MIN_DELIVERIES_PER_TOKEN:g}): its backlog, "
            f"not the engine, timed the window's ends; {KEEP_UP}"
        )
    return np.array(out), ""


def _unusable(wave: list[RequestRecord]) -> str:
    """Why the wave has no window to read at all ("" where it has)."""
    if not wave:
        return "no first wave (an open-loop rate sends no burst)"
    if any(not r.success or not r.chunk_ns for r in wave):
        return "a first-wave request failed or streamed nothing"
    if any(r.chunk_usage is not True or r.token_source != "usage" for r in wave):
        return "the server gave no per-chunk token counts (workload.usage_per_chunk)"
    if len(wave) < 2:
        return "a first wave of one request"
    return ""


def _window(wave: list[RequestRecord]) -> tuple[list[float], float]:
    """Per request, ms per token inside the pure-decode window (stopping at the first request whose
    window holds fewer than MIN_WINDOW_TOKENS), and the wave's deliveries per token there."""
    t0 = max(r.chunk_ns[0] for r in wave)  # the last prefill's first token
    t1 = min(r.chunk_ns[-1] for r in wave)  # the first completion: the next prompt arrives after it
    out, deliveries, tokens = [], 0, 0
    for r in wave:
        d = r.deliveries
        cum = np.cumsum([k for _, k in d])
        t = np.asarray([ns for ns, _ in d])
        inside = np.flatnonzero((t >= t0) & (t <= t1))
        if len(inside) < 2:
            break
        i, j = inside[0], inside[-1]
        if cum[j] - cum[i] < MIN_WINDOW_TOKENS:
            break
        out.append((t[j] - t[i]) / 1e6 / (cum[j] - cum[i]))
        deliveries, tokens = deliveries + j - i, tokens + cum[j] - cum[i]
    return out, (deliveries / tokens if tokens else 0.0)
