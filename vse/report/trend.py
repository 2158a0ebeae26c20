"""The trend report (make trend): per scenario, arm, backend and headline metric, one value per
run directory (night) over time, the change points and outlier nights found in it, as markdown
(for a Buildkite annotation) and a self-contained HTML page with a plot per series."""

from __future__ import annotations

import html as html_lib
import sqlite3
from dataclasses import dataclass

from vse.history import changepoint
from vse.history import store as history

METRICS = ("output_throughput", "median_tpot_ms", "median_ttft_first_wave_ms", "median_itl_token_ms", "median_itl_ms",
           "energy_per_output_token_mj")


@dataclass
class Series:
    scenario: str
    arm: str
    backend: str
    metric: str
    points: list[history.Point]
    detection: changepoint.Detection

    @property
    def higher_is_better(self) -> bool:
        return self.metric.endswith("throughput") or self.metric.endswith("goodput")

    def regressions(self) -> list[changepoint.Change]:
        return [c for c in self.detection.changes if (c.rel < 0) == self.higher_is_better]


def build(db: sqlite3.Connection, python: str | None) -> list[Series]:
    out = []
    for scenario, arm, backend in history.scenarios(db):
        for m in METRICS:
            pts = history.series(db, scenario, arm, m, backend)
            if pts:
                out.append(Series(scenario, arm, backend, m, pts, changepoint.detect([p.value for p in pts], python)))
    return out


def _changes(s: Series) -> str:
    return "; ".join(f"{'**regression**' if c in s.regressions() else 'change'} {100 * c.rel:+.2f}% from "
                     f"{s.points[c.index].run}" for c in s.detection.changes) or "none"


def markdown(series: list[Series]) -> str:
    L = ["# Trend", "", "| Scenario | Arm (backend) | Metric | Nights | Latest | Noise (night sd) | Changes | Outlier nights |",
         "|---|---|---|---:|---:|---:|---|---|"]
    for s in series:
        L.append(f"| {s.scenario} | {s.arm} ({s.backend}) | {s.metric} | {len(s.points)} | {s.points[-1].value:,.2f} | "
                 f"{100 * s.detection.noise:.2f}% | {_changes(s)} | "
                 f"{', '.join(s.points[i].run for i in s.detection.outliers) or 'none'} |")
    methods = sorted({s.detection.method.value for s in series})
    L += ["", f"Change points: {', '.join(methods) or 'none'}; a change is kept when it moves the level by at least "
          f"{changepoint.NOISE_K:g} night-to-night sds and {100 * changepoint.MIN_REL:g}%, and lasts two nights or more; "
          "a night far from both sides is an outlier, not a change.", ""]
    return "\n".join(L)


def _plot(s: Series) -> str:
    from vse.report.plots import plt, svg

    fig, ax = plt.subplots(figsize=(9, 2.6))
    y = [p.value for p in s.points]
    ax.plot(range(len(y)), y, marker=".", lw=1)
    for i in s.detection.outliers:
        ax.plot([i], [y[i]], "x", color="orange", ms=9, label="outlier" if i == s.detection.outliers[0] else None)
    for c in s.detection.changes:
        ax.axvline(c.index - 0.5, color="red" if c in s.regressions() else "green", ls="--", lw=1)
    ax.set_title(f"{s.scenario} / {s.arm} ({s.backend}) / {s.metric}", fontsize=9)
    ax.set_xlabel("night (run directory, in time order)")
    return svg(fig)


def html(series: list[Series]) -> str:
    parts = ["<!doctype html><html><head><meta charset='utf-8'><title>Trend</title><style>body{font-family:sans-serif;"
             "max-width:1100px;margin:auto}</style></head><body><h1>Trend</h1>",
             "<pre>" + html_lib.escape(markdown(series)) + "</pre>"]
    parts += [f"<div>{_plot(s)}</div>" for s in series]
    return "\n".join(parts + ["</body></html>"])

