"""The load-sweep view (run.sweep): one row per load point with its own comparison and verdict,
and a throughput-latency curve per arm that shows where the candidate starts or stops winning.
Each point's full report is in its own directory under sweep/."""

from __future__ import annotations

from typing import Any

from vse.analysis import Analysis, fmt_pct
from vse.report.plots import plt, svg
from vse.scenario import ARMS
from vse.stats import registry
from vse.stats.decide import Outcome
from vse.stats.registry import metric_defs

SHOWN = tuple((m.key, m.label) for m in metric_defs([], False) if "sweep" in m.views)
PREDICTED = ((registry.OUTPUT_THROUGHPUT, "throughput"), (registry.MEDIAN_ITL, "ITL"))
COLORS = {"baseline": "#1f77b4", "candidate": "#d62728"}


def _key(a: Analysis) -> str:
    """The swept workload setting (a run with points has a sweep)."""
    return a.scenario.run.sweep.key if a.scenario.run.sweep else ""


def points(a: Analysis) -> list[tuple[str, Analysis]]:
    """The scenario's own load point first (the run directory itself), then the sweep's."""
    if not a.sweep:
        return []
    key = _key(a)
    return [(f"{key}={getattr(a.scenario.workload, key)} (the scenario's)", a)] + a.sweep


def _metric(p: Analysis, key: str):
    return next((m for m in p.comparison if m.key == key), None)


def _cell(p: Analysis, key: str) -> str:
    m = _metric(p, key)
    if m is None:
        return "n/a"
    return (
        f"{m.baseline:,.1f} / {m.candidate:,.1f} ({fmt_pct(m.rel_change)} [{fmt_pct(m.ci_low)}, {fmt_pct(m.ci_high)}])"
    )


def _gates(p: Analysis) -> str:
    perf = [g for g in p.gates if g.metric is not None]
    return ", ".join(f"{g.metric} {g.outcome.value.upper()}" for g in perf) or "none gated"


def _verdict(p: Analysis) -> str:
    outs = {g.outcome for g in p.gates}
    word = (
        "FAIL"
        if Outcome.FAIL in outs
        else "INCONCLUSIVE"
        if Outcome.INCONCLUSIVE in outs
        else "PASS"
        if p.complete
        else "incomplete"
    )
    return f"{word} (exit {p.exit_code})"


def _predicted(p: Analysis) -> str:
    """What the FP8 GEMM timings alone predict at this point (eval/vse/gemm/predict.py), when the run has them."""
    pred = p.gemm_prediction
    if pred is None:
        return "n/a"
    return ", ".join(f"{word} {pred.predicted_pct[k]:+.2f}%" for k, word in PREDICTED if k in pred.predicted_pct)


HEADER = ["Load point", *(label for _, label in SHOWN), "GEMMs alone predict", "Performance gates", "Verdict", "Report"]
INTRO = (
    "Each point is a comparison with its own verdict on the performance gates (accuracy and agreement are "
    "the server's, checked once at the scenario's own point); the run's exit code is the worst point's. "
    'Cells: baseline / candidate (change [95% CI]). "GEMMs alone predict": the change the run\'s FP8 GEMM '
    "timings predict from each point's own engine steps (n/a without make gemm-bench timings)."
)


def _label(label: str, p: Analysis) -> str:
    """The point's label, saying so where its concurrency limit exceeded its requests (a run recorded
    before such sweeps were refused): it measured num_prompts' concurrency, not its own."""
    w = p.scenario.workload
    if w.max_concurrency is not None and w.max_concurrency > w.num_prompts:
        return f"{label} (only {w.num_prompts} prompts: at most {w.num_prompts} in flight)"
    return label


def table_rows(a: Analysis) -> list[list[str]]:
    return [
        [
            _label(label, p),
            *(_cell(p, k) for k, _ in SHOWN),
            _predicted(p),
            _gates(p),
            _verdict(p),
            "this report" if p is a else f"{p.run_dir.relative_to(a.run_dir)}/summary.md",
        ]
        for label, p in points(a)
    ]


def markdown_lines(a: Analysis) -> list[str]:
    rows = table_rows(a)
    if not rows:
        return []
    L = [
        "## Load sweep (same server starts, one comparison per point)",
        "",
        INTRO,
        "",
        "| " + " | ".join(HEADER) + " |",
        "|---" * len(HEADER) + "|",
    ]
    return L + ["| " + " | ".join(r) + " |" for r in rows] + [""]


def plot_svg(a: Analysis) -> str | None:
    """Output throughput against median TPOT per arm, one marker per load point."""
    xp = [(label.split(" ")[0].split("=")[1], p) for label, p in points(a)]
    pts = [
        (x, p, m, t)
        for x, p in xp
        if (m := _metric(p, registry.OUTPUT_THROUGHPUT)) and (t := _metric(p, registry.MEDIAN_TPOT))
    ]
    if not pts:
        return None
    pts.sort(key=lambda r: r[2].baseline)
    fig, ax = plt.subplots(figsize=(6.5, 3.6))
    for arm in ARMS:
        xs = [getattr(m, arm) for _, _, m, _ in pts]
        ys = [getattr(t, arm) for _, _, _, t in pts]
        ax.plot(xs, ys, "o-", color=COLORS[arm], label=arm)
        for (lab, _, _, _), x, y in zip(pts, xs, ys):
            ax.annotate(lab, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7, color=COLORS[arm])
    ax.set_xlabel("output throughput (tok/s)")
    ax.set_ylabel("median TPOT (ms)")
    ax.set_title(f"Throughput against latency per load point ({_key(a)})")
    ax.legend()
    return svg(fig)


def json_rows(a: Analysis) -> list[dict[str, Any]]:
    rows = []
    for label, p in points(a):
        rows.append(
            {
                "point": label,
                "run_dir": str(p.run_dir),
                "exit_code": p.exit_code,
                "gates": [
                    {"name": g.name, "metric": g.metric, "outcome": g.outcome.value, "detail": g.detail}
                    for g in p.gates
                ],
                "metrics": {
                    k: {
                        "baseline": m.baseline,
                        "candidate": m.candidate,
                        "rel_change": m.rel_change,
                        "ci": [m.ci_low, m.ci_high],
                    }
                    for k, _ in SHOWN
                    if (m := _metric(p, k))
                },
                "gemm_predicted_pct": p.gemm_prediction.predicted_pct if p.gemm_prediction else None,
            }
        )
    return rows
