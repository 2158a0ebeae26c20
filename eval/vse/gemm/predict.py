"""What the kernel timings alone predict end to end. Pure.

The engine steps a run really made are rebuilt from the baseline's token streams: every running
request gets one token per engine step, so chunk arrivals cluster by step (tens of microseconds
apart within a step, milliseconds between steps). A step's M (tokens through every linear layer)
is its decode tokens plus the prompt tokens of the requests whose first token it emitted. With the
GEMM timings of both backends at those M (gemm.json, interpolated), each step's FP8 GEMM time
changes by `layers * sum over shapes (t_cand(M) - t_base(M))`; adding that to every measured step
gives the kernels-only prediction of throughput, TPOT and first-wave TTFT. It ignores everything
but the GEMMs (activation quantisation, fusion, scheduling): a gap between prediction and
measurement says how much of the change is not the GEMM itself.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vse.gemm.shapes import ShapeError, llama_shapes
from vse.rundir.records import RequestRecord
from vse.stats import registry

# Within-step spread of chunk arrivals against the step time: a gap wider than this share of the
# median gap between distinct steps starts a new step.
STEP_GAP_SHARE = 0.2
MIN_STEP_GAP_S = 0.0005


@dataclass(frozen=True)
class Steps:
    """Engine steps of one run, rebuilt from its stream: start time (ns) and tokens per step."""

    t_ns: np.ndarray  # first chunk arrival of each step
    decode: np.ndarray  # tokens emitted for requests already decoding
    prefill: np.ndarray  # prompt tokens of the requests whose first token the step emitted

    @property
    def m(self) -> np.ndarray:
        return self.decode + self.prefill

    @property
    def durations_s(self) -> np.ndarray:
        """Each step's time up to the next one (the last step has none and is dropped)."""
        return np.diff(self.t_ns) / 1e9


def rebuild_steps(records: list[RequestRecord], gap_s: float | None = None) -> Steps:
    ok = [r for r in records if r.phase == "measure" and r.success and r.chunk_ns]
    t = np.concatenate([np.asarray(r.chunk_ns, dtype=np.int64) for r in ok]) if ok else np.zeros(0, np.int64)
    first = np.concatenate([np.arange(len(r.chunk_ns)) == 0 for r in ok]) if ok else np.zeros(0, bool)
    plen = np.concatenate([np.full(len(r.chunk_ns), r.prompt_len) for r in ok]) if ok else np.zeros(0)
    order = np.argsort(t, kind="stable")
    t, first, plen = t[order], first[order], plen[order]
    gaps = np.diff(t) / 1e9
    if gap_s is None:
        gap_s = step_gap(gaps)
    starts = np.r_[0, np.nonzero(gaps > gap_s)[0] + 1] if len(t) else np.zeros(0, int)
    ends = np.r_[starts[1:], len(t)]
    decode = np.array([np.count_nonzero(~first[a:b]) for a, b in zip(starts, ends)], dtype=float)
    prefill = np.array([plen[a:b][first[a:b]].sum() for a, b in zip(starts, ends)], dtype=float)
    return Steps(t[starts], decode, prefill)


def step_gap(gaps_s: np.ndarray) -> float:
    """The gap that separates steps: a share of the typical gap between steps (the gaps wider than
    the median chunk-to-chunk gap by 10x, which within-step arrivals never are)."""
    if not len(gaps_s):
        return MIN_STEP_GAP_S
    wide = gaps_s[gaps_s > 10 * max(float(np.median(gaps_s)), 1e-6)]
    typical = float(np.median(wide)) if len(wide) else float(np.max(gaps_s))
    return max(MIN_STEP_GAP_S, STEP_GAP_SHARE * typical)


class GemmTable:
    """t_backend(shape, M) from gemm.json: linear in M between the measured M (time is flat at
    small M and proportional at large M), proportional above the largest."""

    def __init__(self, gemm: dict):
        self._t: dict[tuple[str, str], tuple[np.ndarray, np.ndarray]] = {}
        rows: dict[tuple[str, str], list[tuple[int, float]]] = {}
        for r in gemm.get("results", []):
            if "us" in r:
                rows.setdefault((r["backend"], r["shape"]), []).append((r["m"], r["us"]))
        for key, pts in rows.items():
            pts.sort()
            self._t[key] = (np.array([p[0] for p in pts], float), np.array([p[1] for p in pts], float))
        self.shapes = sorted({s for _, s in self._t})
        self.backends = sorted({b for b, _ in self._t})

    def has(self, backend: str) -> bool:
        return all((backend, s) in self._t for s in self.shapes) and bool(self.shapes)

    def layer_us(self, backend: str, m: np.ndarray) -> np.ndarray:
        """Time of one decoder layer's FP8 GEMMs (every shape once) at each M, microseconds."""
        total = np.zeros_like(m, dtype=float)
        for s in self.shapes:
            ms, us = self._t[(backend, s)]
            inside = np.interp(m, ms, us)
            total += np.where(m > ms[-1], us[-1] * m / ms[-1], inside)
        return total


@dataclass(frozen=True)
class Prediction:
    steps_per_run: float
    decode_batch_median: float
    prefill_steps_per_run: float
    prefill_m_max: float
    gemm_share: float  # baseline FP8 GEMM time / measured busy time
    gemm_share_decode: float  # the same over decode-only steps
    predicted_pct: dict[str, float]  # metric key -> predicted change, percent
    server_steps_per_run: float | None = None  # vLLM's own count (vllm:iteration_tokens_total), where recorded

    def to_json(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def predict_run(
    records: list[RequestRecord], table: GemmTable, base: str, cand: str, layers: int, first_wave: int | None
) -> tuple[Steps, dict[str, float]]:
    """One run's kernels-only prediction: changes as fractions, plus the step facts behind them."""
    ok = [r for r in records if r.phase == "measure" and r.success and r.chunk_ns]
    if not ok:
        raise ValueError("no successful measured request to rebuild engine steps from")
    st = rebuild_steps(ok)
    dur = st.durations_s
    m = st.m[:-1]
    base_s = layers * table.layer_us(base, m) / 1e6
    delta_s = layers * table.layer_us(cand, m) / 1e6 - base_s
    span = (max(r.end_ns for r in ok) - min(r.scheduled_ns for r in ok)) / 1e9
    dec = st.decode[:-1]
    out = {
        registry.OUTPUT_THROUGHPUT: span / (span + delta_s.sum()) - 1,
        # every decoding request sees each step once: TPOT moves with the decode-weighted step time
        registry.MEDIAN_TPOT: float((dec * delta_s).sum() / max((dec * dur).sum(), 1e-12)),
        "gemm_share": float(base_s.sum() / max(dur.sum(), 1e-12)),
        "gemm_share_decode": float(base_s[st.prefill[:-1] == 0].sum() / max(dur[st.prefill[:-1] == 0].sum(), 1e-12)),
    }
    steady = st.prefill[:-1] == 0  # decode-only steps: the inter-token latency of a steady batch
    if steady.any():
        out[registry.MEDIAN_ITL] = float(np.median(dur[steady] + delta_s[steady]) / np.median(dur[steady]) - 1)
        out[registry.MEDIAN_ITL_TOKEN] = out[registry.MEDIAN_ITL]  # the same engine step, per token
    wave = sorted(ok, key=lambda r: (r.send_ns, r.index))[:first_wave] if first_wave else []
    if wave:
        shift = np.r_[np.cumsum(delta_s), delta_s.sum()]  # after step i, everything later moved by shift[i]
        ttft = np.array([r.ttft_s for r in wave])
        # the step that emitted the first token is the last one starting at or before it
        idx = np.searchsorted(st.t_ns, [r.chunk_ns[0] for r in wave], side="right") - 1
        out[registry.MEDIAN_TTFT_FIRST_WAVE] = float(np.median(ttft + shift[idx]) / np.median(ttft) - 1)
    return st, out


def predict(
    runs: list[list[RequestRecord]],
    gemm: dict,
    base: str,
    cand: str,
    layers: int,
    first_wave: int | None,
    server_steps: list[float] | None = None,
) -> Prediction:
    table = GemmTable(gemm)
    for b in (base, cand):
        if not table.has(b):
            raise ValueError(f"gemm.json has no timings for backend {b!r} (has {', '.join(table.backends) or 'none'})")
    per = [predict_run(rs, table, base, cand, layers, first_wave) for rs in runs if rs]
    if not per:
        raise ValueError("no measured requests to rebuild engine steps from")
    mean = lambda k: float(np.mean([o[k] for _, o in per if k in o] or [np.nan]))
    keys = [registry.OUTPUT_THROUGHPUT, registry.MEDIAN_TPOT, registry.MEDIAN_ITL, registry.MEDIAN_ITL_TOKEN] + (
        [registry.MEDIAN_TTFT_FIRST_WAVE] if first_wave else []
    )
    steps = [s for s, _ in per]
    return Prediction(
        steps_per_run=float(np.mean([len(s.t_ns) for s in steps])),
        decode_batch_median=float(np.median(np.concatenate([s.decode[s.prefill == 0] for s in steps]) if steps else 0)),
        prefill_steps_per_run=float(np.mean([np.count_nonzero(s.prefill) for s in steps])),
        prefill_m_max=float(max(s.m.max() for s in steps)),
        gemm_share=mean("gemm_share"),
        gemm_share_decode=mean("gemm_share_decode"),
        predicted_pct={k: 100 * mean(k) for k in keys},
        server_steps_per_run=float(np.mean(server_steps)) if server_steps else None,
    )


def for_run(
    config: dict | None,
    tp: int,
    gemm: dict,
    runs: list[list[RequestRecord]],
    base: str,
    cand: str,
    first_wave: int | None,
    server_steps: list[float] | None = None,
) -> tuple[Prediction | None, str]:
    """The prediction for a comparison, or None and the reason there is none."""
    if config is None:
        return None, "no config.json for the model, so no layer count and shapes"
    try:
        want = {(x.name, x.k, x.n) for x in llama_shapes(config, tp)}
    except ShapeError as e:
        return None, str(e)
    have = {(r["shape"], r["k"], r["n"]) for r in gemm.get("results", []) if "us" in r}
    if have != want:
        return None, (
            f"the GEMM timings are for other shapes ({sorted(have)}) than this model's at TP{tp} ({sorted(want)})"
        )
    try:
        return predict(runs, gemm, base, cand, int(config["num_hidden_layers"]), first_wave, server_steps), ""
    except ValueError as e:
        return None, str(e)


def server_steps(deltas: list[dict | None]) -> list[float]:
    """Engine steps per run as vLLM counted them, from each run's /metrics deltas (empty where a
    run's server did not expose the histogram: vLLM before it, or an older record)."""
    return [d["vllm:iteration_tokens_total_count"] for d in deltas if d and "vllm:iteration_tokens_total_count" in d]
