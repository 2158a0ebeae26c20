"""From per-arm data to decisions: disturbed runs, which planned look this is, the accuracy
gates and the exit code. Pure functions of loaded data."""

from __future__ import annotations

from typing import Any

import numpy as np

from vse.analysis.load import ARMS, ArmAnalysis, starts_made
from vse.exitcodes import ExitCode
from vse.rundir.records import REQUESTS_FINISHED, SERVER_MEAN_TTFT
from vse.scenario import GateFamily, Scenario
from vse.stats import estimate, gates, registry
from vse.stats.gates import GateResult, Outcome

# Runs are checked for disturbance on the metrics that move least between runs, each with the
# smallest deviation worth calling a disturbance: well above the run-to-run and start-to-start noise
# measured on the GPU (docs/measurements.md). Not median TPOT: on a closed loop it takes one of two
# values a few percent apart by how the waves arrive, and a run in the rarer mode is not disturbed.
# The decode step per token where the chunks' token counts are known (per-chunk ITL moves with
# coalescing), per chunk otherwise.
# A client event-loop stall this long delays every timestamp taken meanwhile: stalls this long have
# cost a run several percent of its throughput, shorter ones under one percent (docs/measurements.md).
CLIENT_STALL_MS = 150.0
HEALTH_METRICS = {registry.OUTPUT_THROUGHPUT: 0.02, registry.TMEAN_ITL_TOKEN: 0.03}
HEALTH_FALLBACK = {registry.TMEAN_ITL_TOKEN: registry.MEDIAN_ITL}
DISTURBED_Z = 3.5  # robust |z| beyond which a run is far from its siblings


def left_out(s: Scenario, arms: dict[str, ArmAnalysis]) -> list[dict[str, Any]]:
    """Every run without a value for a gated metric, with the reason, and every server start that
    thereby counts for nothing: the statistics skip a run without a value, and no skip is silent."""
    defs = {m.key: m for m in registry.metric_defs(s.workload.percentiles, s.workload.goodput is not None, True)}
    out: list[dict[str, Any]] = []
    for gate in s.gates.performance:
        m = defs.get(gate.metric)
        if m is None:
            continue
        for name, arm in arms.items():
            missing: dict[int, list[int]] = {}
            for k, d in enumerate(arm.repeat_data):
                v = estimate.point_value(d, m)
                if not (np.isfinite(v) and v > 0):
                    missing.setdefault(d.start, []).append(k)
                    out.append({"metric": m.key, "arm": name, "run": k, "server_start": d.start, "why": _why(d, m)})
            for start, ks in missing.items():
                if len(ks) == sum(1 for d in arm.repeat_data if d.start == start):
                    out.append(
                        {
                            "metric": m.key,
                            "arm": name,
                            "run": None,
                            "server_start": start,
                            "why": "no run of this server start has a value: the start is not counted",
                        }
                    )
    return out


def unmeasured(left: list[dict[str, Any]], arms: dict[str, ArmAnalysis]) -> dict[str, str]:
    """Gated metric: why it has no value, where an arm has no run with one (left_out's entries; the
    first run's reason, which a gate's "no data" then names)."""
    out: dict[str, str] = {}
    for name, arm in arms.items():
        for key in {e["metric"] for e in left if e["arm"] == name}:
            whys = [e["why"] for e in left if e["arm"] == name and e["metric"] == key and e["run"] is not None]
            if whys and len(whys) == len(arm.repeat_data):
                out.setdefault(key, f"{name}: {whys[0]}")
    return out


def _why(d: estimate.RepeatData, m: registry.MetricDef) -> str:
    if m.source == "decode_first":
        return d.decode_first_why or "no first-wave decode value"
    if not d.n:
        return "no successful request in the run"
    if m.source in ("ttft_first", "ttft_steady") and not getattr(d, m.source).size:
        return "no first wave (an open-loop rate)" if m.source == "ttft_first" else "no request after the first wave"
    return "the run has no value for it"


def disturbed_rule() -> str:
    """find_disturbed's rule in words, from its own constants: the summary quotes this, so the
    text cannot drift from the code."""
    defs = {m.key: m for m in registry.metric_defs([], False)}

    def name(key: str) -> str:  # "Trimmed mean ITL per token (ms)" -> "trimmed mean ITL per token"
        label = defs[key].label.split(" (")[0]
        return label[0].lower() + label[1:]

    far = " or ".join(
        f"{100 * rel:g}% from the arm's median {name(k)}"
        + (f" ({name(HEALTH_FALLBACK[k])} where tokens per chunk are unknown)" if k in HEALTH_FALLBACK else "")
        for k, rel in HEALTH_METRICS.items()
    )
    return f"robust z > {DISTURBED_Z:g}, and more than {far}; or a client event-loop stall of {CLIENT_STALL_MS:g} ms or more"


def find_disturbed(
    arms: dict[str, ArmAnalysis], percentiles: list[float], late: dict[str, dict[int, str]] | None = None
) -> tuple[dict[str, set[int]], list[dict]]:
    """Runs far from their siblings on a steady metric, or whose client stalled or (`late`: a
    replayed trace's runs, by position) sent behind its schedule. Such a run is left out of its
    start's mean when that start has another run (the start still counts), else carried as
    measured; either way it is listed with the server's own view of it."""
    flags = _far_runs(arms, percentiles)
    for name, runs in (late or {}).items():
        for i, lateness in runs.items():
            flags[name].setdefault(i, []).append(lateness)
    for name, arm in arms.items():  # the client itself stalled: its timestamps are late, not the server
        for i, lag in enumerate(arm.loop_lag_ms):
            if (worst := lag.get("max", 0.0)) >= CLIENT_STALL_MS:
                flags[name].setdefault(i, []).append(
                    f"disturbed by the client: its event loop stalled {worst:,.0f} ms "
                    f"(p99 {lag.get('p99', 0.0):,.1f} ms)"
                )
    excluded: dict[str, set[int]] = {}
    listed: list[dict] = []
    for name, arm in arms.items():
        keep = set(range(len(arm.repeat_data))) - set(flags[name])
        for i, why in sorted(flags[name].items()):
            start = arm.repeat_data[i].start
            siblings = any(arm.repeat_data[j].start == start for j in keep)
            if siblings:
                excluded.setdefault(name, set()).add(i)
            dlt = arm.server_deltas[i] or {}
            action = "excluded from its start's mean" if siblings else "carried (only run of its start)"
            listed.append(_listed(name, i, start, "; ".join(why), action, dlt))
        listed += _gpu_slowdowns(name, arm)
    return excluded, listed


def _far_runs(arms: dict[str, ArmAnalysis], percentiles: list[float]) -> dict[str, dict[int, list[str]]]:
    """Per arm, the runs far from the arm's median on a health metric, with why. Each run is set
    against its arm's median and the deviations of both arms pooled: the scale of normal run-to-run
    noise then comes from every run (a small CPU wobbles by percents, a GPU by tenths), not from the three
    or four runs of one arm."""
    defs = {m.key: m for m in registry.metric_defs(percentiles, False)}
    flags: dict[str, dict[int, list[str]]] = {n: {} for n in arms}
    for key, min_rel in HEALTH_METRICS.items():
        if not all(np.isfinite(estimate.point_value(d, defs[key])) for a in arms.values() for d in a.repeat_data):
            key = HEALTH_FALLBACK.get(key, key)
        resid = []
        for name, arm in arms.items():
            vals = [estimate.point_value(d, defs[key]) for d in arm.repeat_data]
            med = float(np.median(vals)) if vals else float("nan")
            if np.isfinite(med) and med > 0:  # an arm whose every request failed has nothing to compare
                resid += [(name, i, v, med) for i, v in enumerate(vals)]
        for j in estimate.disturbed_runs([v / med for _, _, v, med in resid], z_limit=DISTURBED_Z, min_rel=min_rel):
            name, i, v, med = resid[j]
            flags[name].setdefault(i, []).append(f"{defs[key].label} {v:,.2f} vs median {med:,.2f}")
    return flags


def _gpu_slowdowns(name: str, arm: ArmAnalysis) -> list[dict]:
    """Listed, not excluded: heat is not the kernel's doing, but hiding it is worse."""
    out = []
    for i, t in enumerate(arm.telemetry):
        if t.slowdowns:
            share = max(t.share(r) for r in t.slowdowns)
            why = f"GPU slowdown ({', '.join(t.slowdowns)}) in up to {share:.0%} of busy samples"
            out.append(_listed(name, i, arm.repeat_data[i].start, why, "carried (GPU slowdown flagged)", {}))
    return out


def _listed(arm: str, i: int, start: int, why: str, action: str, delta: dict[str, Any]) -> dict[str, Any]:
    return {
        "arm": arm,
        "run": i + 1,
        "server_start": start,
        "why": why,
        "action": action,
        SERVER_MEAN_TTFT: delta.get(SERVER_MEAN_TTFT),
        "server_requests": delta.get(REQUESTS_FINISHED),
    }


def look_of(s: Scenario, arms: dict[str, ArmAnalysis]) -> int:
    """Which planned look this data is: one at server_starts, one more per extra start per arm."""
    starts = min((arms[n].starts for n in ARMS if n in arms), default=0)
    return max(1, min(starts - s.run.server_starts + 1, s.run.looks))


def _accuracy_gates(s: Scenario, run: dict[str, Any], arms: dict[str, ArmAnalysis]) -> list[GateResult]:
    g = s.gates
    if not s.accuracy.enabled:
        return []
    if _random_weights(run, s):
        return [
            GateResult(
                "accuracy",
                Outcome.NOT_APPLICABLE,
                f"model weights are random ({s.model.random_weights_kind}): accuracy was not measured",
                family=GateFamily.ACCURACY,
            )
        ]
    results: list[GateResult] = []
    accs = {n: arms[n].accuracy if n in arms else None for n in ARMS}
    for n in ARMS:
        a = accs[n]
        if a is None:
            results.append(
                GateResult(
                    f"{n} accuracy",
                    Outcome.FAIL,
                    arms[n].accuracy_status if n in arms else "arm did not run",
                    family=GateFamily.ACCURACY,
                )
            )
            continue
        results += gates.sample_counts(n, a, s.accuracy)
        results += gates.accuracy_reference(n, a, s.accuracy, g.accuracy_reference_rtol, g.significance)
    if accs["baseline"] and accs["candidate"]:
        results += gates.accuracy_noninferiority(accs["baseline"], accs["candidate"], g)
    return results


def exit_code_for(status: str | None, results: list[GateResult]) -> int:
    if status != "complete":
        return ExitCode.RUN_FAILED
    if any(r.outcome == Outcome.FAIL for r in results):
        return ExitCode.GATE_FAILED
    if any(r.outcome == Outcome.INCONCLUSIVE for r in results):
        return ExitCode.INCONCLUSIVE
    return ExitCode.OK


def _random_weights(run: dict[str, Any], s: Scenario) -> bool:
    return bool(run.get("weights_random", s.model.weights_are_random))


def unplanned_look(s: Scenario, arms: dict[str, ArmAnalysis]) -> str | None:
    """Why this data is not a look the alpha-spending plan counted (None when it is): the plan looks
    with equal starts per arm, from server_starts up to max_server_starts. A time-budget stop, or a
    resumed run with unbalanced arms, decides nothing on the performance gates."""
    b, c = starts_made(arms)
    top = s.run.max_server_starts or s.run.server_starts
    if b != c:
        return f"unbalanced arms ({b} + {c} server starts): not a look the plan counted"
    if b < s.run.server_starts:
        return f"{b} + {c} server starts, fewer than the planned {s.run.server_starts} per arm"
    if b > top:
        return f"{b} + {c} server starts, more than the plan's {top} per arm"
    return None


def required(s: Scenario, results: list[GateResult]) -> list[GateResult]:
    """gates.require: a required gate that was N/A or never measured makes the run INCONCLUSIVE."""
    out = []
    for fam in s.gates.require:
        mine = [r for r in results if r.family == fam]
        if not mine:
            out.append(
                GateResult(
                    f"{fam.value} (required)",
                    Outcome.INCONCLUSIVE,
                    f"gates.require names {fam.value}, and this run decided no {fam.value} gate",
                )
            )
        elif all(r.outcome == Outcome.NOT_APPLICABLE for r in mine):
            out.append(
                GateResult(
                    f"{fam.value} (required)",
                    Outcome.INCONCLUSIVE,
                    f"gates.require names {fam.value}, and it was not applicable here: {mine[0].detail}",
                )
            )
    return out
