"""bisect.md and bisect.html from bisect.json (eval/vse/orchestration/bisect.py writes all three after
every step)."""

from __future__ import annotations

import html as html_lib
import os
from pathlib import Path
from typing import Any

from vse.rundir.layout import RunDir

VERDICT_COLOURS = {"bad": "#d62728", "good": "#2ca02c", "skip": "#7f7f7f"}


def _headline(state: dict[str, Any]) -> str:
    a = state.get("answer")
    if state.get("status") != "done" or a is None:
        p = state.get("pending")
        return f"**RUNNING**: {len(state['steps'])} step(s) made" + (f"; {p['build']} under way" if p else "")
    if "ends" in a:
        return (
            f"**NOTHING TO BISECT**: the bad end {state['bad_id']} read {a['ends']} against the good end "
            f"{state['builds'][state['good']]['id']}, not FAIL"
        )
    if a["culprit"]:
        line = (
            f"**CULPRIT: {a['culprit']}** (the first build that FAILs against the good end; "
            f"{a['last_good']} before it PASSes); {a['decided_steps']} decided step(s), chance the answer "
            f"is wrong at most {a['p_wrong_at_most']:.0%}"
        )
        if a["more_than_one_change"]:
            line += (
                f". **The range holds more than one change**: the bad end is worse than {a['culprit']} alone on "
                f"{', '.join(a['more_than_one_change'])}; bisect again from {a['culprit']} (as the good end) to "
                f"{state['bad_id']}"
            )
        return line
    return (
        f"**RANGE: after {a['last_good']}, up to {a['first_bad']}** (the skipped build(s) "
        f"{', '.join(a['skipped'])} could not be decided); chance the range is wrong at most {a['p_wrong_at_most']:.0%}"
    )


def finding(state: dict[str, Any], folder: str) -> str | None:
    """The bisection's answer in one line, as `vse trend --ack --bisect` records it as the reason
    a change was accepted; None while it runs or when its bad end did not FAIL (nothing found)."""
    a = state.get("answer")
    if state.get("status") != "done" or a is None or "ends" in a:
        return None
    steps = {s["build"]: s for s in state["steps"]}
    if a["culprit"]:
        evidence = _change(steps[a["culprit"]]) if a["culprit"] in steps else ""
        line = f"vse bisect ({folder}): culprit {a['culprit']}, after {a['last_good']}" + (
            f"; {evidence}" if evidence else ""
        )
    else:
        line = f"vse bisect ({folder}): after {a['last_good']}, up to {a['first_bad']} (undecided: {', '.join(a['skipped'])})"
    return line + f"; chance wrong at most {a['p_wrong_at_most']:.0%}"


def _change(step: dict[str, Any]) -> str:
    parts = []
    for key, c in step.get("changes", {}).items():
        if c.get("rel_change") is not None:
            parts.append(f"{key} {c['rel_change']:+.2%} [{c['ci_low']:+.2%}, {c['ci_high']:+.2%}]")
    return "; ".join(parts) or step.get("note", "")


def markdown(state: dict[str, Any]) -> str:
    ids = [b["id"] for b in state["builds"]]
    lines = [
        f"# Bisection: {state['scenario']}",
        "",
        _headline(state),
        "",
        f"Builds, oldest first: {', '.join(ids)}; good end {ids[state['good']]}, bad end {state['bad_id']}. "
        f"Each step is one comparison against the good end, decided by the scenario's gates (FAIL bad, "
        f"PASS good, anything else skipped); alpha per step {state['alpha']:g}; the chance bound sums it over "
        "the decided steps. Intervals: each gated metric's 95% interval, candidate against the good end.",
        "",
        "| step | build | verdict | exit | gated changes against the good end | server minutes | run |",
        "|---:|---|---|---:|---|---:|---|",
    ]
    for n, s in enumerate(state["steps"], 1):
        lines.append(
            f"| {n} | {s['build']} | {s['verdict']} | {s['exit_code']} | {_change(s)} | "
            f"{s.get('server_minutes', 0.0):.1f} | {s['run'] or '-'} |"
        )
    total = sum(s.get("server_minutes", 0.0) for s in state["steps"])
    lines += ["", f"Server minutes in all: {total:.1f}. Each step's run directory holds its own reports."]
    return "\n".join(lines) + "\n"


def _plot(state: dict[str, Any]) -> str:
    """Each step's gated changes against the good end, with their 95% intervals, by build: where the
    change comes in. Empty without a decided step's interval."""
    from vse.report.plots import plt, svg

    points = [
        (s["index"], key, c, s["verdict"])
        for s in state["steps"]
        for key, c in s.get("changes", {}).items()
        if None not in (c.get("rel_change"), c.get("ci_low"), c.get("ci_high"))
    ]
    if not points:
        return ""
    ids = [b["id"] for b in state["builds"]]
    fig, ax = plt.subplots(figsize=(9, 3))
    for i, key, c, verdict in points:
        y = 100 * c["rel_change"]
        err = [[y - 100 * c["ci_low"]], [100 * c["ci_high"] - y]]
        ax.errorbar([i], [y], yerr=err, fmt="o", color=VERDICT_COLOURS.get(verdict, "k"), capsize=3)
        ax.annotate(key, (i, y), textcoords="offset points", xytext=(5, 5), fontsize=7)
    ax.axhline(0, color="k", lw=0.8)
    ax.set_xticks(range(len(ids)), [x[:12] for x in ids], rotation=45, ha="right", fontsize=7)
    ax.set_ylabel("change against the good end (%)")
    return svg(fig)


def html(state: dict[str, Any]) -> str:
    """A page of its own: the answer, each step's verdict and gated changes with a link to its run's
    report, and the changes by build with their intervals."""
    folder = state["folder"]
    esc = html_lib.escape
    rows = []
    for n, s in enumerate(state["steps"], 1):
        link = "-"
        if s.get("run"):
            page = os.path.relpath(RunDir(Path(s["run"])).html, folder)
            link = f"<a href='{esc(page)}'>{esc(os.path.dirname(page))}</a>"
        colour = VERDICT_COLOURS.get(s["verdict"], "#000")
        rows.append(
            f"<tr><td>{n}</td><td>{esc(s['build'])}</td><td style='color:{colour}'><b>{esc(s['verdict'])}</b></td>"
            f"<td>{s['exit_code']}</td><td>{esc(_change(s))}</td><td>{s.get('server_minutes', 0.0):.1f}</td>"
            f"<td>{link}</td></tr>"
        )
    headline = esc(_headline(state).replace("**", ""))
    return "\n".join(
        [
            "<!doctype html><html><head><meta charset='utf-8'>",
            f"<title>Bisection: {esc(state['scenario'])}</title><style>body{{font-family:sans-serif;max-width:1100px;"
            "margin:auto}table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:3px 6px}</style>",
            f"</head><body><h1>Bisection: {esc(state['scenario'])}</h1><p><b>{headline}</b></p>",
            "<table><tr><th>step</th><th>build</th><th>verdict</th><th>exit</th>"
            "<th>gated changes against the good end (95% intervals)</th><th>server minutes</th><th>run</th></tr>",
            *rows,
            "</table>",
            f"<div>{_plot(state)}</div>",
            "</body></html>",
        ]
    )
