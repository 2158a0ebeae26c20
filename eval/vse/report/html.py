"""report.html: one self-contained file (inline SVG plots, inline CSS, no scripts or remote
assets) that opens offline: the summary's tables plus the plots engineers look at first."""

from __future__ import annotations

import html as html_lib
import math
import re
from pathlib import Path

import numpy as np
from jinja2 import Environment, FileSystemLoader, select_autoescape
from markupsafe import Markup

from vse.analysis import Analysis, ArmAnalysis, fmt_pct
from vse.report import gpu_view, kernel_view, markdown, sweep
from vse.report.plots import plt, svg
from vse.scenario import ARMS
from vse.stats import registry
from vse.stats.metrics import measured, per_second

COLORS = {"baseline": "#1f77b4", "candidate": "#d62728"}
_MAX_POINTS = 1500


def _svg(fig) -> Markup:
    return Markup(svg(fig))


def _thin(x: np.ndarray) -> np.ndarray:
    if len(x) <= _MAX_POINTS:
        return x
    return x[np.linspace(0, len(x) - 1, _MAX_POINTS).astype(int)]


def cdf_plot(arms: list[ArmAnalysis]) -> Markup:
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.2))
    for ax, (src, title) in zip(axes, (("ttft", "TTFT (ms)"), ("tpot", "TPOT (ms)"), ("itl", "ITL (ms)"))):
        for arm in arms:
            if src == "itl":
                vals = np.concatenate([np.concatenate(d.itl) if d.itl else np.array([]) for d in arm.repeat_data])
            else:
                vals = np.concatenate([getattr(d, src) for d in arm.repeat_data])
            vals = np.sort(vals[np.isfinite(vals)])
            if not len(vals):
                continue
            y = np.arange(1, len(vals) + 1) / len(vals)
            idx = np.linspace(0, len(vals) - 1, min(len(vals), _MAX_POINTS)).astype(int)
            ax.plot(vals[idx], y[idx], color=COLORS[arm.name], label=f"{arm.name}: {arm.label}")
        ax.set_title(f"CDF of {title}")
        ax.set_xlabel(title)
        if src == "itl":
            ax.set_xscale("log")
    axes[0].set_ylabel("fraction of requests (ITL: of gaps)")
    axes[0].legend(loc="lower right", fontsize=8)
    return _svg(fig)


def throughput_plot(arms: list[ArmAnalysis]) -> Markup:
    fig, ax = plt.subplots(figsize=(11, 3))
    for arm in arms:
        for k, rep in enumerate(arm.raw):
            ok = [r for r in measured(rep.records) if r.success]
            if not ok:
                continue
            t0 = min(r.scheduled_ns for r in measured(rep.records))
            t1 = max(r.end_ns for r in ok)
            n = int(math.ceil((t1 - t0) / 1e9)) + 1
            # each request's exact total over its chunks: a coalescing server's throughput is not undercounted
            tok, _ = per_second(ok, t0, n, spread_to_output=True)
            ax.plot(
                np.arange(n),
                tok,
                color=COLORS[arm.name],
                alpha=0.9 - 0.2 * min(k, 3),
                label=f"{arm.name} repeat {k + 1}",
            )
    ax.set_title("Output tokens per second over each run (coalesced chunks weighted by their request's token count)")
    ax.set_xlabel("seconds since the run's first request")
    ax.set_ylabel("tokens/s")
    ax.legend(fontsize=7, ncol=3)
    return _svg(fig)


def latency_vs_send_plot(arms: list[ArmAnalysis]) -> Markup:
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.2))
    for arm in arms:
        for k, rep in enumerate(arm.raw):
            ms = measured(rep.records)
            ok = [r for r in ms if r.success]
            if not ok:
                continue
            t0 = min(r.scheduled_ns for r in ms)
            x = np.array([(r.send_ns - t0) / 1e9 for r in ok])
            lbl = f"{arm.name}" if k == 0 else None
            axes[0].scatter(x, [r.ttft_s * 1e3 for r in ok], s=4, color=COLORS[arm.name], alpha=0.5, label=lbl)
            axes[1].scatter(x, [r.e2el_s * 1e3 for r in ok], s=4, color=COLORS[arm.name], alpha=0.5, label=lbl)
            bad = [r for r in ms if not r.success]
            if bad:
                axes[1].scatter(
                    [(r.send_ns - t0) / 1e9 for r in bad],
                    [0] * len(bad),
                    marker="x",
                    color="black",
                    label="failed" if k == 0 else None,
                )
    axes[0].set_title("TTFT of each request against its send time")
    axes[1].set_title("E2E latency of each request against its send time")
    for ax in axes:
        ax.set_xlabel("send time (s since the run's start)")
        ax.set_ylabel("ms")
        ax.legend(fontsize=7)
    return _svg(fig)


def change_plot(a: Analysis) -> Markup:
    rows = [r for r in a.comparison if math.isfinite(r.rel_change)]
    fig, ax = plt.subplots(figsize=(8, 0.28 * len(rows) + 1))
    # A few wild metrics (a p99 over 3 runs, ITL of a coalescing server) must not squash the
    # rest: the axis spans 3x the typical change, and whatever lies beyond ends in an arrow.
    lim = max(10.0, 3 * float(np.percentile([abs(100 * r.rel_change) for r in rows], 75))) if rows else 10.0
    for i, r in enumerate(rows):
        good = (r.rel_change > 0) == r.higher_is_better
        color = "#2ca02c" if r.verdict.value == "better" else "#d62728" if r.verdict.value == "worse" else "#7f7f7f"
        lo = 100 * (r.ci_low if math.isfinite(r.ci_low) else r.rel_change)
        hi = 100 * (r.ci_high if math.isfinite(r.ci_high) else r.rel_change)
        ax.plot([max(lo, -lim), min(hi, lim)], [i, i], color=color, lw=2)
        if lo < -lim:
            ax.plot([-lim], [i], "<", color=color, ms=5)
        if hi > lim:
            ax.plot([lim], [i], ">", color=color, ms=5)
        x = 100 * r.rel_change
        ax.plot(
            [min(max(x, -lim), lim)],
            [i],
            "o" if abs(x) <= lim else (">" if x > 0 else "<"),
            color=color,
            ms=4 if abs(x) <= lim else 7,
            mfc=color if good else "white",
        )
    ax.set_xlim(-lim * 1.05, lim * 1.05)
    ax.axvline(0, color="black", lw=0.8)
    ax.set_yticks(range(len(rows)), [r.label for r in rows])
    ax.invert_yaxis()
    ax.set_xlabel("candidate vs baseline (%), 95% CI; green better, red worse, grey no significant change")
    return _svg(fig)


def starts_plot(a: Analysis) -> Markup | None:
    """Run-level values of the gated metrics by server start: what the interval is built from."""
    keys = [g.metric for g in a.scenario.gates.performance] or [registry.OUTPUT_THROUGHPUT, registry.MEDIAN_TPOT]
    rows = [r for r in a.comparison if r.key in keys]
    if not rows:
        return None
    fig, axes = plt.subplots(1, len(rows), figsize=(3.7 * len(rows), 3), squeeze=False)
    for ax, r in zip(axes[0], rows):
        for name, runs, starts, dx in (
            ("baseline", r.baseline_runs, r.baseline_starts, -0.1),
            ("candidate", r.candidate_runs, r.candidate_starts, 0.1),
        ):
            ax.scatter(np.asarray(starts) + 1 + dx, runs, color=COLORS[name], s=18, label=name)
        ax.set_title(r.label, fontsize=9)
        ax.set_xlabel("server start")
        ax.set_xticks(sorted({s + 1 for s in r.baseline_starts + r.candidate_starts}))
    axes[0][0].legend(fontsize=7)
    return _svg(fig)


def accuracy_plot(arms: list[ArmAnalysis]) -> Markup | None:
    with_acc = [(a, a.accuracy) for a in arms if a.accuracy]
    if not with_acc:
        return None
    keys = sorted({k for _, acc in with_acc for k in acc.scores})
    fig, ax = plt.subplots(figsize=(8, 3))
    width = 0.8 / len(with_acc)
    for j, (arm, acc) in enumerate(with_acc):
        vals = [acc.scores.get(k, np.nan) for k in keys]
        errs = [acc.stderrs.get(k, 0.0) for k in keys]
        ax.bar(
            np.arange(len(keys)) + j * width,
            vals,
            width,
            yerr=errs,
            capsize=3,
            color=COLORS[arm.name],
            label=f"{arm.name}: {arm.label}",
        )
    ax.set_xticks(np.arange(len(keys)) + width * (len(with_acc) - 1) / 2, keys, fontsize=8)
    ax.set_ylabel("score (± stderr)")
    ax.set_title("Accuracy (lm-eval)")
    ax.legend(fontsize=8)
    return _svg(fig)


def render(a: Analysis) -> str:
    arms = [a.arms[n] for n in ARMS if n in a.arms]
    have_bench = [x for x in arms if x.repeat_data]
    plots = []
    if have_bench:
        plots += [
            ("Latency distributions", cdf_plot(have_bench)),
            ("Throughput over time", throughput_plot(have_bench)),
            ("Per-request latency against send time", latency_vs_send_plot(have_bench)),
        ]
    if a.comparison:
        plots.insert(0, ("Relative change with 95% confidence intervals", change_plot(a)))
        if (sp := starts_plot(a)) is not None:
            plots.insert(1, ("Run-level values by server start (the replication unit)", sp))
    if (fig := gpu_view.plot(have_bench, COLORS)) is not None:
        plots.append(("GPU power and SM clock (NVML)", _svg(fig)))
    if (sw := sweep.plot_svg(a)) is not None:
        plots.insert(0, ("Load sweep: throughput against latency per arm", Markup(sw)))
    if a.gemm:
        plots.append(
            (
                f"FP8 GEMMs of this model on this GPU (TFLOP/s against M; make gemm-bench, {a.gemm_source})",
                Markup(kernel_view.plot_svg(a.gemm)),
            )
        )
    acc = accuracy_plot(arms)
    if acc is not None:
        plots.append(("Accuracy", acc))
    env = Environment(
        loader=FileSystemLoader(Path(__file__).with_name("templates")), autoescape=select_autoescape(["html"])
    )
    return env.get_template("report.html.j2").render(
        a=a,
        arms=arms,
        plots=plots,
        headline=Markup(_inline_md(markdown.headline(a))),
        where=markdown.where(a),
        fmt_pct=fmt_pct,
        num=markdown.num,
        autotune=markdown.autotune_text,
        checks_only=markdown.checks_only_text,
        md=lambda t: Markup(_inline_md(t)),
        gates=a.gates,
        roles=markdown.gated_roles(a),
        design=markdown.design_text(a) if a.comparison else "",
        workload=markdown.workload_text(a),
        telemetry_header=gpu_view.HEADER,
        telemetry_rows=gpu_view.rows(a),
        telemetry_missing=gpu_view.missing(a),
        gemm_header=kernel_view.PREDICTION_HEADER,
        gemm_rows=kernel_view.prediction_rows(a.gemm_prediction, a.comparison) if a.gemm_prediction else [],
        gemm_text=kernel_view.prediction_text(a.gemm_prediction, a.gemm_prediction_note),
        sweep_header=sweep.HEADER,
        sweep_rows=sweep.table_rows(a),
        sweep_intro=sweep.INTRO,
        traffic=[from_markdown(lines) for lines in markdown.traffic_sections(a) if lines],
    )


def from_markdown(lines: list[str]) -> Markup:
    """A summary section as HTML (the traffic sections: replay fidelity, stages, turns): its title,
    paragraphs and one table, so the two reports cannot say different things."""
    out: list[str] = []
    rows = [ln for ln in lines if ln.startswith("|")]
    for ln in lines:
        if ln.startswith("## "):
            out.append(f"<h2>{html_lib.escape(ln[3:])}</h2>")
        elif ln and not ln.startswith("|"):
            out.append(f"<p>{_inline_md(ln)}</p>")
        elif ln.startswith("|") and ln is rows[0]:
            cells = [
                [html_lib.escape(c.strip()) for c in r.strip("|").split("|")] for r in rows if not r.startswith("|---")
            ]
            head = "".join(f"<th>{c}</th>" for c in cells[0])
            body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in cells[1:])
            out.append(f"<table><tr>{head}</tr>{body}</table>")
    return Markup("\n".join(out))


def _inline_md(text: str) -> str:
    """The headline's **bold** as <strong>, everything else escaped."""
    return re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", html_lib.escape(text))
