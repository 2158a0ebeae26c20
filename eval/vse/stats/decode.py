"""The decode step measured where nothing else runs: the first wave's pure decode phase."""

from __future__ import annotations

import numpy as np

from vse.rundir.records import RequestRecord

MIN_WINDOW_TOKENS = 32  # fewer tokens in the window: its two ends' jitter would dominate


def first_wave_decode_ms(wave: list[RequestRecord]) -> np.ndarray:
    """Per request of the first wave, milliseconds per token while the wave decodes alone.

    In a closed loop the first wave's prompts are all prefilled at the start (the last first token
    marks the end of the last prefill) and no new request is sent until one of them completes, so
    between those two instants every engine step is a pure decode step of the whole wave: no
    prefill rides along, whatever the arm's speed. Within that window a request's time per token is
    (last delivery - first delivery) / (tokens between them, by the server's per-chunk counts):
    packing several tokens into a chunk moves only the two end points, by a step or so of a
    window of hundreds. Empty where the window holds too few tokens (short outputs, outputs of
    mixed length), where the server's per-chunk counts are missing, or without a first wave."""
    ok = [r for r in wave if r.success and r.chunk_ns and r.chunk_usage is True and r.token_source == "usage"]
    if len(ok) < 2 or len(ok) < len(wave):
        return np.array([])
    t0 = max(r.chunk_ns[0] for r in ok)  # the last prefill's first token
    t1 = min(r.chunk_ns[-1] for r in ok)  # the first completion: the next prompt arrives after it
    out = []
    for r in ok:
        cum = np.cumsum(r.chunk_tokens)
        t = np.asarray(r.chunk_ns)
        inside = np.flatnonzero((t >= t0) & (t <= t1))
        if len(inside) < 2:
            continue
        i, j = inside[0], inside[-1]
        if cum[j] - cum[i] >= MIN_WINDOW_TOKENS:
            out.append((t[j] - t[i]) / 1e6 / (cum[j] - cum[i]))
    return np.array(out) if len(out) == len(ok) else np.array([])
