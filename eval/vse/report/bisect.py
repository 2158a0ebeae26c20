"""bisect.md from bisect.json (eval/vse/orchestration/bisect.py writes both after every step)."""

from __future__ import annotations

from typing import Any


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
