"""From a run directory to conclusions: per-arm metrics per repeat, the comparison with
intervals and verdicts, accuracy and agreement, gates and the exit code. Reads raw data
only, so `make report` can rebuild everything without a server."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vse.analysis import pace
from vse.analysis.felt import FeltView, felt_view
from vse.analysis.load import ARMS, ArmAnalysis, first_wave, load_arm, load_scenario_from_run, starts_made
from vse.analysis.notes import _ttft_notes, _workload_differences, machine_notes, width_notes
from vse.analysis.replay import ReplayView, replay_view
from vse.analysis.stages import StageRow, stage_view
from vse.analysis.turns import TurnRow, turn_view
from vse.analysis.verdict import (
    _accuracy_gates,
    exit_code_for,
    find_disturbed,
    left_out,
    look_of,
    required,
    unmeasured,
    unplanned_look,
)
from vse.gemm import predict as gemm_predict
from vse.models import sources
from vse.quality import agreement, fidelity
from vse.rundir import seal, sweep_points
from vse.rundir.files import read_json
from vse.rundir.layout import RunDir
from vse.scenario import Scenario
from vse.server import planted, whatif
from vse.stats import decide, estimate, gates, metrics, registry
from vse.stats.calibration import STEPS_KEY
from vse.stats.gates import GateResult


@dataclass
class Analysis:
    run_dir: Path
    run: dict[str, Any]
    scenario: Scenario
    environment: dict[str, Any]
    arms: dict[str, ArmAnalysis]
    comparison: list[estimate.MetricComparison]
    agreement: dict[str, Any] | None
    gates: list[GateResult]
    exit_code: int
    notes: list[str]
    noise_floor: list[estimate.MetricComparison] | None = None
    agreement_self: dict[str, Any] | None = None
    fidelity: dict[str, Any] | None = None  # to agreement.reference (eval/vse/quality/fidelity.py)
    disturbed: list[dict[str, Any]] = field(default_factory=list)  # every excluded or flagged run
    left_out: list[dict[str, Any]] = field(default_factory=list)  # runs and starts without a gated metric's value
    look: int = 1
    looks: int = 1
    gate_alpha: float = 0.05
    gemm: dict[str, Any] | None = None  # gemm/gemm.json: the GEMM benchmark made with this run (GPU)
    gemm_source: str = "same run"  # or the gemm.json given to `make report GEMM=...`
    gemm_prediction: gemm_predict.Prediction | None = None  # what those kernel timings alone predict
    gemm_prediction_note: str = ""  # why there is no prediction
    sweep: list[tuple[str, Analysis]] = field(default_factory=list)  # (point label, its analysis)
    felt: FeltView | None = None  # two releases: what a user of the candidate would feel (felt.py)
    replay: ReplayView | None = None  # a replayed trace: send lag and prefix-cache reuse per run (replay.py)
    stages: list[StageRow] | None = None  # a staged load: every metric stage by stage (stages.py)
    turns: list[TurnRow] | None = None  # a sessions run: TTFT by turn index (turns.py)

    @property
    def complete(self) -> bool:
        return self.run.get("status") == "complete"

    @property
    def run_id(self) -> str:
        """The run's name from its run.json (a run made before 0.4 by its folder's)."""
        return str(self.run.get("run") or self.run_dir.resolve().name)


def analyze(
    run_dir: Path, *, noise_run: Path | None = None, gemm_file: Path | None = None, regate: Sequence[str] = ()
) -> Analysis:
    run_dir = Path(run_dir)
    s = load_scenario_from_run(run_dir, regate)
    layout = RunDir(run_dir)
    run = read_json(layout.run_json)
    env = read_json(layout.environment) if layout.environment.is_file() else {}
    seal.verify(run_dir)  # raw data changed since the run wrote it is refused before anything is read
    arms = {n: a for n in ARMS if (a := load_arm(run_dir, n, s)) is not None}
    g = s.gates
    replay = replay_view(run_dir, s, arms)
    excluded, disturbed = find_disturbed(arms, s.workload.percentiles, replay.late() if replay else None)
    look = look_of(s, arms)
    gate_alpha = decide.spent_alpha(
        g.significance, s.run.server_starts + look - 1, s.run.server_starts, s.run.max_server_starts
    )
    comparison = _compare(s, arms, excluded) if _both_measured(arms) else []
    notes = (
        _arm_kinds(s, arms) + _comparison_notes(comparison) + _ttft_notes(arms, replay is None) + machine_notes(arms)
    )
    notes += replay.notes() if replay else []
    off_pace = pace.off_pace(arms)  # read once: the note and the decode gates say the same
    notes += _coalescing_notes(arms) + ([f"decode gates not decided: {off_pace}"] if off_pace else [])
    notes += width_notes(comparison, g.significance, {p.metric for p in g.performance})
    agree, self_agree = _agreements(arms)
    fid = fidelity.from_run(run_dir, g.significance) if s.agreement.reference else None
    results = _request_gates(arms, g.max_failed_fraction) + _accuracy_gates(s, run, arms)
    results += _output_gates(s, agree, self_agree, fid, pending=bool(run.get("stopped")))
    gate_rows = comparison
    if comparison and any(excluded.values()):  # a gated metric never loses a run on its own
        gate_rows = _compare(s, arms, {})
        # one number per gated metric: the headline, the table and the gate row show the estimate
        # the gate decided on; only exploratory rows leave disturbed runs out
        gated = {g.metric for g in s.gates.performance}
        every = {r.key: r for r in gate_rows}
        comparison = [every[r.key] if r.key in gated else r for r in comparison]
        notes.append(
            "gated metrics are estimated and decided on every run, disturbed ones included; exploratory "
            "rows leave disturbed runs out of their start's mean"
        )
    left = left_out(s, arms)
    results += _performance_gates(s, arms, gate_rows, gate_alpha, off_pace, unmeasured(left, arms))
    results += required(s, results)
    noise = analyze(noise_run) if noise_run is not None else None
    if noise is not None and noise_run is not None:
        notes += _noise_notes(s, noise, noise_run)
    notes = _status_notes(run_dir, run, s, arms) + notes
    if regate:  # first: a verdict under other margins than the run's must not pass for the run's own
        notes.insert(
            0,
            "**gated with settings other than those the run was made with** (`--regate "
            + " ".join(regate)
            + "`); the run's own scenario.yaml is unchanged",
        )
    own = layout.gemm_result
    gemm_path = gemm_file if gemm_file is not None else own if own.is_file() else None
    results, points = _sweep_points(run_dir, s, results, gate_alpha, gemm_path)
    code = sweep_points.worst_exit([exit_code_for(run.get("status"), results)] + [p.exit_code for _, p in points])
    out = Analysis(
        run_dir=run_dir,
        run=run,
        scenario=s,
        environment=env,
        arms=arms,
        comparison=comparison,
        agreement=agree,
        gates=results,
        exit_code=code,
        notes=notes,
        noise_floor=noise.comparison if noise is not None else None,
        agreement_self=self_agree,
        fidelity=fid,
        disturbed=disturbed,
        left_out=left,
        look=look,
        looks=s.run.looks,
        gate_alpha=gate_alpha,
        sweep=points,
        felt=felt_view(arms, env, comparison, g.significance),
        replay=replay,
        stages=stage_view(s, arms),
        turns=turn_view(s, arms),
    )
    if gemm_path is not None:
        out.gemm = read_json(gemm_path)
        out.gemm_source = str(gemm_file) if gemm_file is not None else "same run"
        _predict(out, gemm_file)
    return out


Measured = dict[str, Any] | None  # an agreement or fidelity result, None where it was not measured


def _output_gates(
    s: Scenario, agree: Measured, self_agree: Measured, fid: Measured, *, pending: bool
) -> list[GateResult]:
    """Agreement, and fidelity to the reference where the scenario has one."""
    if not s.agreement.enabled:
        return []
    out = gates.agreement(agree, self_agree, s.gates, pending=pending)
    if s.agreement.reference:
        out += gates.fidelity(fid, s.gates, s.agreement.reference.label, pending=pending)
    return out


def _performance_gates(
    s: Scenario,
    arms: dict[str, ArmAnalysis],
    rows: list[estimate.MetricComparison],
    gate_alpha: float,
    off_pace: str | None,
    absent: dict[str, str],
) -> list[GateResult]:
    """off_pace: why the client's decode readings are not the engine's (pace.off_pace), or None;
    absent: why a gated metric has no value in an arm (verdict.unmeasured)."""
    g, plan = s.gates, (s.run.server_starts, s.run.max_server_starts)
    defs = registry.metric_defs(s.workload.percentiles, s.workload.goodput is not None)
    return gates.performance(
        rows,
        g,
        gate_alpha,
        undecidable=unplanned_look(s, arms),
        alpha_at=lambda k: decide.spent_alpha(g.significance, k, *plan),
        max_starts=s.run.max_server_starts or s.run.server_starts,
        refused={**absent, **pace.refused_metrics(off_pace, defs)},
    )


def _noise_notes(s: Scenario, noise: Analysis, noise_run: Path) -> list[str]:
    differ = _workload_differences(s, noise.scenario)
    if not differ:
        return []
    return [
        f"the A/A run {Path(noise_run).name} had another workload ({'; '.join(differ)}): its "
        "intervals are not this run's noise floor, only an indication"
    ]


def _both_measured(arms: dict[str, ArmAnalysis]) -> bool:
    return all(n in arms and arms[n].repeat_data for n in ARMS)


def _compare(s: Scenario, arms: dict[str, ArmAnalysis], excluded: dict) -> list[estimate.MetricComparison]:
    return estimate.compare_arms(
        arms["baseline"].repeat_data,
        arms["candidate"].repeat_data,
        s.workload.percentiles,
        goodput=s.workload.goodput is not None,
        alpha=s.gates.significance,
        excluded=excluded,
    )


def _comparison_notes(comparison: list[estimate.MetricComparison]) -> list[str]:
    if not comparison:
        return ["the comparison needs benchmark data from both arms"]
    if comparison[0].design is estimate.Design.QUICK_LOOK:
        return [
            "one server start per arm: a quick look. Its intervals ignore start-to-start variation and "
            "are optimistic; no performance gate is decided from it (they are INCONCLUSIVE)."
        ]
    return []


def _arm_kinds(s: Scenario, arms: dict[str, ArmAnalysis]) -> list[str]:
    """What each arm is, first in every report format: a what-if or a planted slowdown is never
    mistaken for a real candidate."""
    first: list[str] = []
    for n in ARMS:
        spec = getattr(s.arms, n)
        if spec.whatif:
            first.insert(
                0,
                f"{n} ({spec.label}) is a **{whatif.LABEL}**: FlashInfer's per-tensor FP8 "
                f"GEMM below compute capability 10.0, enabled by the suite's vLLM plugin. "
                + whatif.TACTICS_NOTE[whatif.tactics_mode(arms[n].servers if n in arms else [], spec)],
            )
        if spec.planted_slowdown is not None:
            first.insert(
                0,
                f"{n} ({spec.label}) is a **{planted.LABEL}**: {planted.describe(spec)}, added by the suite's vLLM plugin.",
            )
    return first


def _coalescing_notes(arms: dict[str, ArmAnalysis]) -> list[str]:
    out = []
    for a in arms.values():
        cpt = [float(m["chunks_per_token"]) for m in a.repeats if m.get("chunks_per_token")]
        if cpt and min(cpt) < 0.9:
            out.append(
                f"{a.name}: the server coalesced tokens (as few as {min(cpt):.2f} chunks per token), so "
                "its per-chunk ITL measures gaps between chunks, not tokens: compare the decode gate "
                "(first wave's decode per token) or ITL per token (both need workload.usage_per_chunk). (vLLM sends no chunk for "
                "a token that decodes to no new text, common with random weights, and merges a stream's "
                "pending tokens into one chunk when its API server falls behind at high token rates.)"
            )
    base, cand = arms.get("baseline"), arms.get("candidate")
    if base is None or cand is None:
        return out
    bc, cc = coalesced_share(base), coalesced_share(cand)
    if bc is not None and cc is not None:
        bp, cp = prefill_share(base), prefill_share(cand)
        pre = lambda p: f"{100 * p:.0f}%" if p is not None else "unknown"
        text = (
            f"decode mix: baseline {100 * bc:.0f}% of tokens in multi-token chunks, {pre(bp)} of engine steps "
            f"with a prefill; candidate {100 * cc:.0f}%, {pre(cp)}"
        )
        if abs(bc - cc) > 0.10 or (bp is not None and cp is not None and abs(bp - cp) > 0.03):
            text += (
                ": they differ, which moves per-token ITL statistics (exploratory); the decode gate measures "
                "the first wave's pure decode steps, which neither reaches"
            )
        out.append(text)
    return out


def coalesced_share(a: ArmAnalysis) -> float | None:
    """Share of output tokens that arrived in a chunk of two or more (server-counted chunks only)."""
    multi = total = 0
    for rep in a.raw:
        for r in rep.records:
            if r.phase == "measure" and r.chunk_usage is True:
                multi += sum(k for k in r.chunk_tokens if k > 1)
                total += sum(r.chunk_tokens)
    return multi / total if total else None


def prefill_share(a: ArmAnalysis) -> float | None:
    """Share of engine steps that carried a prefill: measured requests over vLLM's own step count."""
    pairs: list[tuple[int, float]] = []
    for rep, d in zip(a.raw, a.server_deltas):
        steps = (d or {}).get(STEPS_KEY)
        if steps:
            pairs.append((sum(1 for r in rep.records if r.phase == "measure"), float(steps)))
    return sum(n for n, _ in pairs) / sum(st for _, st in pairs) if pairs else None


def _agreements(arms: dict[str, ArmAnalysis]) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    base, cand = arms.get("baseline"), arms.get("candidate")
    b_out = base.agreement if base else None
    c_out = cand.agreement if cand else None
    again = base.agreement_self if base else None
    agree = agreement.compare(b_out, c_out) if b_out and c_out else None
    self_agree = agreement.compare(b_out, again) if b_out and again else None
    return agree, self_agree


def _request_gates(arms: dict[str, ArmAnalysis], max_failed_fraction: float) -> list[GateResult]:
    out = []
    for n, a in arms.items():
        if a.repeat_data:
            total = sum(d.n + d.failed for d in a.repeat_data)
            errors = [
                r.error
                for rep in a.raw
                for r in sorted(metrics.measured(rep.records), key=lambda x: x.end_ns)
                if not r.success
            ]
            failed = sum(d.failed for d in a.repeat_data)
            out.append(gates.failed_requests(n, failed, total, max_failed_fraction, gates.error_kinds(errors)))
    return out


def _status_notes(run_dir: Path, run: dict[str, Any], s: Scenario, arms: dict[str, ArmAnalysis]) -> list[str]:
    """How the run ended, before anything else: unfinished, or stopped by its time budget."""
    out = []
    if (status := run.get("status")) != "complete":
        out.append(f"run {status}: {run.get('reason') or 'no reason recorded'}")
    if stopped := run.get("stopped"):  # the time budget ended the call before the plan did (compare.py)
        b, c = starts_made(arms)
        out.append(
            f"stopped after {b} + {c} server starts, before the plan's end ({s.run.server_starts} to "
            f"{s.run.max_server_starts or s.run.server_starts} per arm): {stopped} "
            f"(`make compare RESUME={run_dir} BUDGET=<seconds>` goes on)"
        )
    return out


def _sweep_points(
    run_dir: Path, s: Scenario, results: list[GateResult], gate_alpha: float, gemm_path: Path | None
) -> tuple[list[GateResult], list[tuple[str, Analysis]]]:
    """A load sweep's points are run directories of their own (eval/vse/rundir/sweep_points.py), each with its
    verdict and the run's GEMM timings (what the kernels alone predict at each load is the sweep's
    "why"). The sweep's FAILs are Holm-corrected across all of its points."""
    points = [
        (label, analyze(d, gemm_file=gemm_path))
        for label, d in sweep_points.point_dirs(run_dir, s)
        if RunDir(d).run_json.is_file()
    ]
    if not points:
        return results, []
    family = gates.across_points([results] + [p.gates for _, p in points], gate_alpha)
    for (_, p), decided in zip(points, family[1:]):
        p.gates, p.exit_code = decided, exit_code_for(p.run.get("status"), decided)
    return family[0], points


def _predict(a: Analysis, gemm_file: Path | None) -> None:
    """The kernels-only prediction beside the measured change (eval/vse/gemm/predict.py)."""
    s, base, gemm = a.scenario, a.arms.get("baseline"), a.gemm or {}
    gpu_run = ", ".join(g.get("name", "") for g in a.environment.get("gpus", []))
    if gemm_file is not None and gemm.get("gpu") and gemm["gpu"] not in gpu_run:
        a.gemm_prediction_note = f"the GEMM timings were made on {gemm['gpu']}, this run on {gpu_run or 'no GPU'}"
        return
    if base is None or "candidate" not in a.arms:
        a.gemm_prediction_note = "the prediction needs both arms' benchmark data"
        return
    wave = first_wave(s)
    a.gemm_prediction, a.gemm_prediction_note = gemm_predict.for_run(
        sources.model_config(s.model),
        s.server.tensor_parallel_size,
        gemm,
        [r.records for r in base.raw],
        base.backend,
        a.arms["candidate"].backend,
        wave,
        gemm_predict.server_steps(base.server_deltas),
    )


def fmt_pct(x: float) -> str:
    return "n/a" if x is None or not math.isfinite(x) else f"{100 * x:+.2f}%"
