"""The English notes a report carries about a run: what kind of arm each is (what-if, calibration),
run-level TTFT in two groups, starts on several machines, a noise run with another workload."""

from __future__ import annotations

import math

import numpy as np

from vse.analysis.load import ArmAnalysis
from vse.scenario import Scenario
from vse.stats import estimate, registry
from vse.stats.decide import starts_to_decide

WIDE = 0.10  # a headline interval reaching further than this either side of its estimate is called wide


def _workload_differences(s: Scenario, other: Scenario) -> list[str]:
    """What the noise run did differently; a noise floor only holds for the same load."""
    mine, theirs = s.workload.model_dump(mode="json"), other.workload.model_dump(mode="json")
    return [f"{k}: {theirs[k]} there, {mine[k]} here" for k in mine if mine[k] != theirs.get(k)]


def _ttft_notes(arms: dict[str, ArmAnalysis], closed_loop: bool = True) -> list[str]:
    """Run-level TTFT that falls into two groups, within an arm or across both (where it may also
    be a real difference between the arms): say so, and point at the stable measures. A closed
    loop's waves make such groups; an open loop (a replayed trace) has no waves, and its
    replay note says what its TTFT means."""
    out: list[str] = []
    if not closed_loop:
        return out
    defs = [registry.MetricDef(f"{st}_ttft_ms", f"{st} TTFT", False, "ttft", st) for st in ("mean", "median")]
    groups = [(a.name, a.repeat_data) for a in arms.values()]
    if len(arms) == 2:
        groups.append(("both arms together", [d for a in arms.values() for d in a.repeat_data]))
    for name, data in groups:
        for m in defs:
            modes = estimate.two_modes([estimate.point_value(r, m) for r in data])
            if modes.bimodal:
                out.append(
                    f"{name}: run-level {m.label} falls into two groups ({len(modes.low)} runs near "
                    f"{np.mean(modes.low):,.0f} ms, {len(modes.high)} near {np.mean(modes.high):,.0f} ms; the "
                    f"split explains {modes.r2:.0%} of the variance)"
                    + (
                        ": that can be a real difference between the arms or the workload's run-to-run bimodality"
                        if name == "both arms together"
                        else ""
                    )
                    + ". Median and mean TTFT verdicts then depend on how many runs land in each group; "
                    "first-wave TTFT (an idle server taking a full burst) is the stable measure of prefill "
                    "speed, TTFT after the first wave the one that moves with the groups."
                )
                break
    return out


def machine_notes(arms: dict[str, ArmAnalysis]) -> list[str]:
    """A run resumed on another machine: its machine-to-machine offset is inside the arm difference
    wherever an arm's starts all ran on one machine and the other arm's on another. A start that made
    up lost checks ran no workload: named, but it moves no speed figure."""

    def starts(
        servers: list[dict],
    ) -> str:  # measured starts numbered on their own: a resume's make-up start comes first
        measured = iter(range(1, len(servers) + 1))
        return ", ".join(
            (f"start {next(measured)}" if sv.get("measured", True) else "checks only")
            + f" on {sv.get('machine') or 'unrecorded'}"
            for sv in servers
        )

    machines = {sv["machine"] for a in arms.values() for sv in a.servers if sv.get("machine")}
    if len(machines) < 2:
        return []
    per_arm = "; ".join(f"{n}: {starts(a.servers)}" for n, a in arms.items())
    return [
        f"server starts ran on {len(machines)} different machines (a run resumed after the machine was "
        f"given back): {per_arm}. A machine-to-machine offset is part of any arm difference it lines up with."
    ]


def width_notes(comparison: list[estimate.MetricComparison], alpha: float, gated: set[str]) -> list[str]:
    """Why a headline metric's exploratory interval is wide, and what would narrow it: which arm's
    server starts disagree and by how much, Welch's degrees of freedom, and the starts per arm a
    change of the estimated size would need to be told from none. (A gated metric's gate row says
    the starts its margin needs.)"""
    out = []
    headline = registry.keys_for("headline")
    for r in comparison:
        if r.key not in headline or r.key in gated or r.design is not estimate.Design.STARTS:
            continue
        if not all(map(math.isfinite, (r.ci_low, r.ci_high, r.var_base, r.var_cand, r.rel_change))):
            continue
        if min(r.ci_high - r.rel_change, r.rel_change - r.ci_low) <= WIDE:
            continue
        sd = {"baseline": math.sqrt(r.var_base), "candidate": math.sqrt(r.var_cand)}
        loud = max(sd, key=lambda k: sd[k])
        quiet = "candidate" if loud == "baseline" else "baseline"
        need = starts_to_decide(r.est, math.log1p(r.rel_change), 0.0, lambda _k: alpha)
        out.append(
            f"{r.label}: its interval [{100 * r.ci_low:+.2f}%, {100 * r.ci_high:+.2f}%] is wide: {r.n_base} + "
            f"{r.n_cand} server starts give Welch's interval {r.df:.1f} degrees of freedom, and the {loud}'s "
            f"starts differ by {100 * sd[loud]:.1f}% (the sd of their means; the {quiet}'s {100 * sd[quiet]:.1f}%); "
            + (
                f"were the change really {100 * r.rel_change:+.2f}%, about {need} server starts per arm would tell "
                "it from none"
                if need is not None
                else f"at this spread not even 50 server starts per arm would tell {100 * r.rel_change:+.2f}% from none"
            )
        )
    return out
