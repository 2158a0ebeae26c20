"""From per-arm data to decisions: disturbed runs, which planned look this is, the accuracy
gates and the exit code. Pure functions of loaded data."""


from __future__ import annotations

from typing import Any

import numpy as np

from vse.analysis.load import ARMS, ArmAnalysis
from vse.exitcodes import ExitCode
from vse.scenario import Scenario
from vse.stats import estimate as stats
from vse.stats import gates
from vse.stats.gates import GateResult, Outcome

EXIT_OK, EXIT_GATE_FAILED, EXIT_RUN_FAILED, EXIT_INCONCLUSIVE, EXIT_UNSUPPORTED = (
    ExitCode.OK, ExitCode.GATE_FAILED, ExitCode.RUN_FAILED, ExitCode.INCONCLUSIVE, ExitCode.UNSUPPORTED)


# Runs are checked for disturbance on the metrics that move least between runs, each with the
# smallest deviation worth calling a disturbance: well above the run-to-run noise seen on the
# H200 (throughput 0.04-0.4%, median ITL under 1%, and 2% between server starts made 15 minutes
# apart). Not median TPOT: on a closed loop it takes one of two values 2-3% apart by how the
# waves arrive, and a run in the rarer mode is not disturbed (the H200 A/A lost one that way).
HEALTH_METRICS = {"output_throughput": 0.02, "median_itl_ms": 0.03}


def find_disturbed(arms: dict[str, ArmAnalysis], percentiles: list[float]) -> tuple[dict[str, set[int]], list[dict]]:
    """Runs far from their siblings on a steady metric. Such a run is left out of its start's
    mean when that start has another run (the start still counts), else carried as measured;
    either way it is listed with the server's own view of it."""
    defs = {m.key: m for m in stats.metric_defs(percentiles, False)}
    excluded: dict[str, set[int]] = {}
    listed: list[dict] = []
    flags: dict[str, dict[int, list[str]]] = {n: {} for n in arms}
    for key, min_rel in HEALTH_METRICS.items():
        # Each run against its arm's median, the deviations of both arms pooled: the scale of
        # normal run-to-run noise then comes from every run (a 2-core CPU wobbles by 5%, an H200
        # by 0.1%), not from the three or four runs of one arm.
        resid = []
        for name, arm in arms.items():
            vals = [stats.point_value(d, defs[key]) for d in arm.repeat_data]
            med = float(np.median(vals)) if vals else float("nan")
            if np.isfinite(med) and med > 0:  # an arm whose every request failed has nothing to compare
                resid += [(name, i, v, med) for i, v in enumerate(vals)]
        for j in stats.disturbed_runs([v / med for _, _, v, med in resid], min_rel=min_rel):
            name, i, v, med = resid[j]
            flags[name].setdefault(i, []).append(f"{defs[key].label} {v:,.2f} vs median {med:,.2f}")
    for name, arm in arms.items():
        flagged = flags[name]
        keep = set(range(len(arm.repeat_data))) - set(flagged)
        for i, why in sorted(flagged.items()):
            start = arm.repeat_data[i].start
            siblings = any(arm.repeat_data[j].start == start for j in keep)
            if siblings:
                excluded.setdefault(name, set()).add(i)
            dlt = arm.server_deltas[i] or {}
            listed.append({"arm": name, "run": i + 1, "server_start": start, "why": "; ".join(why),
                           "action": "excluded from its start's mean" if siblings else "carried (only run of its start)",
                           "server_mean_ttft_ms": dlt.get("server_mean_ttft_ms"),
                           "server_requests": dlt.get("vllm:request_success_total")})
        for i, t in enumerate(arm.telemetry):
            if t.slowdowns:  # listed, not excluded: heat is not the kernel's doing, but hiding it is worse
                share = max(t.share(r) for r in t.slowdowns)
                listed.append({"arm": name, "run": i + 1, "server_start": arm.repeat_data[i].start,
                               "why": f"GPU slowdown ({', '.join(t.slowdowns)}) in up to {share:.0%} of busy samples",
                               "action": "carried (GPU slowdown flagged)", "server_mean_ttft_ms": None,
                               "server_requests": None})
    return excluded, listed


def look_of(s: Scenario, arms: dict[str, ArmAnalysis]) -> int:
    """Which planned look this data is: one at server_starts, one more per extra start per arm."""
    starts = min((arms[n].starts for n in ARMS if n in arms), default=0)
    return max(1, min(starts - s.run.server_starts + 1, s.run.looks))


def _accuracy_gates(s: Scenario, run: dict[str, Any], arms: dict[str, ArmAnalysis]) -> list[GateResult]:
    g = s.gates
    if not s.accuracy.enabled:
        return []
    if _random_weights(run, s):
        return [GateResult("accuracy", Outcome.NOT_APPLICABLE,
                           f"model weights are random ({s.model.random_weights_kind}): accuracy was not measured")]
    results: list[GateResult] = []
    accs = {n: arms[n].accuracy if n in arms else None for n in ARMS}
    for n in ARMS:
        a = accs[n]
        if a is None:
            results.append(GateResult(f"{n} accuracy", Outcome.FAIL,
                                      arms[n].accuracy_status if n in arms else "arm did not run"))
            continue
        results += gates.sample_counts(n, a, s.accuracy)
        results += gates.accuracy_reference(n, a, s.accuracy, g.accuracy_reference_rtol, g.significance)
    if accs["baseline"] and accs["candidate"]:
        results += gates.accuracy_noninferiority(accs["baseline"], accs["candidate"], g)
    return results


def exit_code_for(status: str | None, results: list[GateResult]) -> int:
    if status != "complete":
        return EXIT_RUN_FAILED
    if any(r.outcome == Outcome.FAIL for r in results):
        return EXIT_GATE_FAILED
    if any(r.outcome == Outcome.INCONCLUSIVE for r in results):
        return EXIT_INCONCLUSIVE
    return EXIT_OK


def _random_weights(run: dict[str, Any], s: Scenario) -> bool:
    return bool(run.get("weights_random", s.model.weights_are_random))


