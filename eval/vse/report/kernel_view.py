"""The GEMM view (make gemm-bench): per FP8 shape of the model, time and TFLOP/s against M for
each backend with the GPU's measured ceiling, and each backend's speed relative to CUTLASS by
M range (decode batches, prefill chunks). Built from gemm.json alone."""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path

import numpy as np

from vse.backends import Backend
from vse.gemm.shapes import decode_or_prefill
from vse.rundir.layout import GemmDir
from vse.scenario import Scenario
from vse.stats import registry

# Dense FP8 tensor rate from the datasheets (TFLOP/s, without sparsity), by GPU name.
DATASHEET_FP8_TFLOPS = {"H200": 1979.0, "H100 80GB HBM3": 1979.0, "H100": 1979.0, "B200": 4500.0}
REFERENCE = Backend.CUTLASS.value


def datasheet(gpu: str) -> float | None:
    return next((v for k, v in DATASHEET_FP8_TFLOPS.items() if k in gpu), None)


def ceiling(res: dict) -> float | None:
    ok = [c["tflops"] for c in res.get("ceiling", []) if "tflops" in c]
    return max(ok) if ok else None


def _ok(res: dict) -> list[dict]:
    return [r for r in res["results"] if "us" in r]


def ratios(res: dict, max_num_seqs: int | None) -> dict[str, dict[str, float]]:
    """backend -> {decode, prefill}: geometric mean over shapes and M of CUTLASS time / backend
    time (above 1: faster than CUTLASS)."""
    t = {(r["backend"], r["shape"], r["m"]): r["us"] for r in _ok(res)}
    acc: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for (b, sh, m), us in t.items():
        if b != REFERENCE and (REFERENCE, sh, m) in t:
            acc[b][decode_or_prefill(m, max_num_seqs)].append(math.log(t[(REFERENCE, sh, m)] / us))
    return {b: {rng: math.exp(float(np.mean(v))) for rng, v in d.items()} for b, d in acc.items()}


def ratio_lines(res: dict, max_num_seqs: int | None, level: str = "##") -> list[str]:
    rt = ratios(res, max_num_seqs)
    if not rt:
        return []
    return (
        [
            f"{level} Speed relative to CUTLASS (CUTLASS time / backend time; above 1 is faster)",
            "",
            "| Backend | decode (M <= max_num_seqs) | prefill (larger M) |",
            "|---|---:|---:|",
        ]
        + [
            f"| {b} | {d.get('decode', float('nan')):.3f} | {d.get('prefill', float('nan')):.3f} |"
            for b, d in sorted(rt.items())
        ]
        + [""]
    )


def error_lines(res: dict, level: str = "##") -> list[str]:
    """Each backend's worst error against the float32 reference, per shape (over every M): the
    kernels' own numerics, which output agreement between two arms cannot be tighter than."""
    worst: dict[str, dict[str, float]] = defaultdict(dict)
    for r in _ok(res):
        if r.get("max_rel_error") is not None:
            w = worst[r["backend"]]
            w[r["shape"]] = max(w.get(r["shape"], 0.0), r["max_rel_error"])
    if not worst:
        return []
    shapes = list(dict.fromkeys(r["shape"] for r in _ok(res)))
    return (
        [
            f"{level} Error against a float32 reference (max |out - ref| / max |ref|, worst over M)",
            "",
            "bf16 rounding of the output alone is about 0.2%; more is the kernel's accumulation. Two arms' "
            "outputs cannot agree more closely than their kernels' errors allow.",
            "",
            "| Backend | " + " | ".join(shapes) + " |",
            "|---|" + "---:|" * len(shapes),
        ]
        + [
            f"| {b} | " + " | ".join(f"{100 * w[s]:.2f}%" if s in w else "n/a" for s in shapes) + " |"
            for b, w in sorted(worst.items(), key=lambda kv: (kv[0] != REFERENCE, kv[0]))
        ]
        + [""]
    )


def compare_section(res: dict, max_num_seqs: int | None, source: str = "same run") -> list[str]:
    """What `make compare` shows of a GEMM benchmark made in the same run (gemm/ in its directory)
    or given to `make report GEMM=...`."""
    ceil_ = ceiling(res)
    where = "`gemm/gemm.md`" if source == "same run" else f"`{Path(source).with_name('gemm.md')}`"
    return (
        [
            f"## FP8 GEMMs of this model on this GPU (make gemm-bench, {source})",
            "",
            f"Measured ceiling {ceil_:,.0f} TFLOP/s"
            + (f" (datasheet {datasheet(res.get('gpu', '')):,.0f})" if datasheet(res.get("gpu", "")) else "")
            + "; per shape and "
            f"M in {where}.",
            "",
        ]
        + ratio_lines(res, max_num_seqs, "###")
        + error_lines(res, "###")
    )


PREDICTED = (registry.OUTPUT_THROUGHPUT, registry.MEDIAN_TPOT, registry.MEDIAN_ITL, registry.MEDIAN_TTFT_FIRST_WAVE)


PREDICTION_HEADER = ["Metric", "GEMMs alone predict", "Measured (95% CI)", "Verdict"]


def prediction_rows(pred, comparison: list) -> list[list[str]]:
    measured = {c.key: c for c in comparison}
    return [
        [
            c.label,
            f"{pred.predicted_pct[key]:+.2f}%",
            f"{100 * c.rel_change:+.2f}% [{100 * c.ci_low:+.2f}%, {100 * c.ci_high:+.2f}%]",
            c.verdict.value,
        ]
        for key in PREDICTED
        if key in pred.predicted_pct and (c := measured.get(key)) is not None
    ]


def prediction_text(pred, note: str) -> str:
    if pred is None:
        return f"No prediction: {note}."
    return (
        f"FP8 GEMMs take {100 * pred.gemm_share:.0f}% of the baseline's busy time "
        f"({100 * pred.gemm_share_decode:.0f}% of its decode-only steps). Engine steps rebuilt from the "
        f"baseline's token streams: {pred.steps_per_run:,.0f} per run"
        + (f" (vLLM counted {pred.server_steps_per_run:,.0f})" if pred.server_steps_per_run else "")
        + f", median decode batch "
        f"{pred.decode_batch_median:,.0f}, {pred.prefill_steps_per_run:,.0f} steps with prefill (M up to "
        f"{pred.prefill_m_max:,.0f}). The prediction adds each step's GEMM time difference at its M to the "
        "measured steps and changes nothing else (activation quantization, fusions and scheduling stay as "
        "measured): where the columns differ, the GEMM itself does not explain the change."
    )


def prediction_lines(pred, note: str, comparison: list) -> list[str]:
    """The kernels-only prediction (eval/vse/gemm/predict.py) beside the measured change."""
    L = ["### What the GEMM timings alone predict", ""]
    if pred is not None:
        L += ["| " + " | ".join(PREDICTION_HEADER) + " |", "|---|---:|---:|---|"]
        L += ["| " + " | ".join(r) + " |" for r in prediction_rows(pred, comparison)] + [""]
    return L + [prediction_text(pred, note), ""]


def markdown(res: dict, max_num_seqs: int | None, title: str) -> str:
    backends = sorted({r["backend"] for r in res["results"]}, key=lambda b: (b != REFERENCE, b))
    ceil_, sheet = ceiling(res), datasheet(res.get("gpu", ""))
    L = [
        f"# FP8 GEMMs: {title}",
        "",
        f"- GPU: {res.get('gpu')} (compute capability {'.'.join(map(str, res.get('capability', [])))}); "
        f"torch {res.get('torch')}, " + ", ".join(f"{k} {v}" for k, v in res.get("versions", {}).items()),
        f"- Measured FP8 ceiling (best backend, large square GEMMs): {ceil_:,.0f} TFLOP/s"
        if ceil_
        else "- Measured FP8 ceiling: n/a",
        f"- Datasheet dense FP8: {sheet:,.0f} TFLOP/s" if sheet else "- Datasheet dense FP8: unknown for this GPU",
        "- Timing: CUDA graph of 10 GEMMs replayed 100 times, CUDA events, median per GEMM; fresh random FP8 "
        "inputs with per-tensor scales; each output checked against a float32 reference first; weights rotated "
        "beyond the L2 cache. Activation quantization is not timed.",
        "",
    ]
    for b, err in res.get("errors", {}).items():
        L.append(f"- **{b} could not run**: {err}")
    L += ratio_lines(res, max_num_seqs) + error_lines(res)
    by_shape: dict[tuple[str, int, int], dict[int, dict[str, dict]]] = defaultdict(lambda: defaultdict(dict))
    for r in res["results"]:
        by_shape[(r["shape"], r["k"], r["n"])][r["m"]][r["backend"]] = r
    for (name, k, n), rows in by_shape.items():
        L += [
            f"## {name}: K={k}, N={n}",
            "",
            "| M | " + " | ".join(f"{b} us (TFLOP/s)" for b in backends) + " |",
            "|---:|" + "---:|" * len(backends),
        ]
        for m in sorted(rows):
            cells = []
            for b in backends:
                r = rows[m].get(b, {})
                cells.append(f"{r['us']:,.1f} ({r['tflops']:,.0f})" if "us" in r else r.get("error", "n/a")[:60])
            L.append(f"| {m} | " + " | ".join(cells) + " |")
        L.append("")
    return "\n".join(L)


def plot_svg(res: dict) -> str:
    from vse.report.plots import plt, svg

    shapes = list(dict.fromkeys((r["shape"], r["k"], r["n"]) for r in res["results"]))
    fig, axes = plt.subplots(1, max(1, len(shapes)), figsize=(3.6 * max(1, len(shapes)), 3.2), squeeze=False)
    ceil_, sheet = ceiling(res), datasheet(res.get("gpu", ""))
    for ax, (name, k, n) in zip(axes[0], shapes):
        for b in sorted({r["backend"] for r in res["results"]}):
            pts = sorted((r["m"], r["tflops"]) for r in _ok(res) if r["backend"] == b and r["shape"] == name)
            if pts:
                ax.plot(*zip(*pts), marker=".", label=b)
        for val, style, lbl in ((ceil_, "--", "measured ceiling"), (sheet, ":", "datasheet")):
            if val:
                ax.axhline(val, ls=style, color="gray", lw=0.8, label=lbl)
        ax.set_xscale("log", base=2)
        ax.set_title(f"{name} (K={k}, N={n})", fontsize=9)
        ax.set_xlabel("M (tokens)")
    axes[0][0].set_ylabel("TFLOP/s")
    axes[0][0].legend(fontsize=7)
    return svg(fig)


def html(res: dict, max_num_seqs: int | None, title: str) -> str:
    import html as h

    md = markdown(res, max_num_seqs, title)
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>" + h.escape(title) + "</title>"
        "<style>body{font-family:sans-serif;max-width:1200px;margin:auto}pre{white-space:pre-wrap}</style>"
        "</head><body>" + plot_svg(res) + "<pre>" + h.escape(md) + "</pre></body></html>"
    )


def write_reports(res: dict, out: Path, s: Scenario) -> None:
    title = f"{s.name} (TP{s.server.tensor_parallel_size})"
    d = GemmDir(out)
    d.markdown.write_text(markdown(res, s.server.max_num_seqs, title))
    d.html.write_text(html(res, s.server.max_num_seqs, title))
