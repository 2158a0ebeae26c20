"""The trend report (make trend): per scenario, arm, backend and headline metric, one value per
run directory (night) over time, the change points and outlier nights found in it, as markdown
(for a Buildkite annotation) and a self-contained HTML page with a plot per series."""

from __future__ import annotations

import html as html_lib
import math
from dataclasses import dataclass, field

import sqlalchemy as sa

from vse.history import changepoint
from vse.history import store as history
from vse.stats.registry import keys_for

METRICS = keys_for("trend")  # the metric registry (stats/registry.py) says which


@dataclass
class Series:
    key: history.SeriesKey
    metric: str
    points: list[history.Point]
    detection: changepoint.Detection
    accepted: dict[tuple[str, str], history.Ack] = field(default_factory=dict)

    def ack(self, c: changepoint.Change) -> history.Ack | None:
        """Who accepted this change and why, if someone did (vse trend --ack)."""
        return self.accepted.get((self.points[c.index].key, self.metric))

    def open_regression(self) -> changepoint.Change | None:
        """The series' latest change when it is a regression nobody accepted: what fails the trend."""
        last = self.detection.changes[-1] if self.detection.changes else None
        return last if last is not None and last in self.regressions() and self.ack(last) is None else None

    @property
    def higher_is_better(self) -> bool:
        return self.metric.endswith("throughput") or self.metric.endswith("goodput")

    def regressions(self) -> list[changepoint.Change]:
        return [c for c in self.detection.changes if (c.rel < 0) == self.higher_is_better]


def build(db: sa.Engine, python: str | None) -> list[Series]:
    out, accepted = [], history.acks(db)
    for key in history.series_keys(db):
        for m in METRICS:
            pts = history.series(db, key, m)
            if pts:
                out.append(Series(key, m, pts, changepoint.detect([p.value for p in pts], python), accepted))
    return out


def _noise(s: Series) -> str:
    """The night-to-night sd, or n/a where one night cannot have one."""
    n = s.detection.noise
    return f"{100 * n:.2f}%" if len(s.points) > 1 and math.isfinite(n) else "n/a"


def _changes(s: Series) -> str:
    return (
        "; ".join(
            f"{_kind(s, c)} {100 * c.rel:+.2f}% from {s.points[c.index].run} [{s.points[c.index].key[:12]}]"
            for c in s.detection.changes
        )
        or "none"
    )


def _bisect_hint(s: Series) -> str:
    """The nights on either side of a series' open regression, with the vLLM each ran, as the ends
    of a bisection over the builds between them."""
    c = s.open_regression()
    assert c is not None and c.index > 0  # a change has nights before it
    good, bad = s.points[c.index - 1], s.points[c.index]
    return (
        f"- {s.key.title()}, {s.metric}: last good night {good.run} (vLLM {good.vllm or 'not recorded'}), first bad "
        f"{bad.run} (vLLM {bad.vllm or 'not recorded'}): `bin/vse bisect --scenario <{s.key.scenario}> --builds "
        f"builds.yaml`, builds.yaml listing the installs from {good.vllm or good.run} to {bad.vllm or bad.run}"
    )


def open_regressions(series: list[Series]) -> list[dict]:
    """trend.json: each series' open regression with the nights on either side and the vLLM each ran,
    for a machine to act on (the nightly's opt-in bisection: vse bisect --from-trend)."""
    out = []
    for s in series:
        if (c := s.open_regression()) is None:
            continue
        good, bad = s.points[c.index - 1], s.points[c.index]
        out.append(
            {
                "scenario": s.key.scenario,
                "arm": s.key.arm,
                "backend": s.key.backend,
                "series": s.key.title(),
                "metric": s.metric,
                "change_pct": round(100 * c.rel, 4),
                "last_good": {"run": good.run, "key": good.key, "vllm": good.vllm},
                "first_bad": {"run": bad.run, "key": bad.key, "vllm": bad.vllm},
            }
        )
    return out


def _kind(s: Series, c: changepoint.Change) -> str:
    if c not in s.regressions():
        return "change"
    ack = s.ack(c)
    return f"regression, accepted by {ack.by} ({ack.why})" if ack else "**regression**"


def markdown(series: list[Series], walk: list[str] | None = None) -> str:
    L = [
        "# Trend",
        "",
        "| Series | Metric | Nights | Latest | Noise (night sd) | Detector | Changes | Outlier nights |",
        "|---|---|---:|---:|---:|---|---|---|",
    ]
    for s in series:
        L.append(
            f"| {s.key.title()} | {s.metric} | {len(s.points)} | {s.points[-1].value:,.2f} | "
            f"{_noise(s)} | {s.detection.method.value} | {_changes(s)} | "
            f"{', '.join(s.points[i].run for i in s.detection.outliers) or 'none'} |"
        )
    methods = sorted({s.detection.method.value for s in series})
    open_ = [s for s in series if s.open_regression()]
    if open_:
        L += [
            "",
            f"{len(open_)} series end in a regression nobody accepted. Once one is understood and accepted, "
            "record who and why, and the trend stops failing on it (one line per series):",
            "",
        ]
        for s in open_:
            c = s.open_regression()
            assert c is not None
            L.append(
                f"    bin/vse trend --db ... --ack {s.points[c.index].key[:12]} --metric {s.metric} --why '...'"
                f"   # {s.key.title()}"
            )
        L += ["", "To trace a regression to its build (docs/bisect.md), bisect the builds between the two nights:", ""]
        L += [_bisect_hint(s) for s in open_]
    if walk:
        L += ["", "## This walk of the run directories", ""] + [f"- {line}" for line in walk]
    L += [
        "",
        f"Change points: {', '.join(methods) or 'none'}; a change is kept when it moves the level by at least "
        f"{changepoint.NOISE_K:g} night-to-night sds and {100 * changepoint.MIN_REL:g}%, and lasts two nights or more; "
        "a night far from both sides is an outlier, not a change.",
        "",
    ]
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
    ax.set_title(f"{s.key.title()} / {s.metric}", fontsize=8)
    ax.set_xlabel("night (run directory, in time order)")
    return svg(fig)


def html(series: list[Series], walk: list[str] | None = None) -> str:
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>Trend</title><style>body{font-family:sans-serif;"
        "max-width:1100px;margin:auto}</style></head><body><h1>Trend</h1>",
        "<pre>" + html_lib.escape(markdown(series, walk)) + "</pre>",
    ]
    parts += [f"<div>{_plot(s)}</div>" for s in series]
    return "\n".join(parts + ["</body></html>"])
