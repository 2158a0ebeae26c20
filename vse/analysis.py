"""From a run directory to conclusions: per-arm metrics per repeat, the comparison with
intervals and verdicts, accuracy and agreement, gates and the exit code. Reads raw data
only, so `make report` can rebuild everything without a server."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from vse import sweep
from vse.checks import accuracy, agreement, fidelity
from vse.checks.agreement import Completion
from vse.gemm import predict as gemm_predict
from vse.models import sources as models
from vse.rundir.files import read_json
from vse.rundir.rawdata import load_repeats, repeat_metrics
from vse.scenario import Scenario
from vse.server import whatif
from vse.stats import decide, gates, metrics
from vse.stats import estimate as stats
from vse.stats import telemetry as gpu_telemetry
from vse.stats.gates import GateResult, Outcome
from vse.stats.telemetry import Telemetry

ARMS = ("baseline", "candidate")
EXIT_OK, EXIT_GATE_FAILED, EXIT_RUN_FAILED, EXIT_INCONCLUSIVE, EXIT_UNSUPPORTED = 0, 1, 2, 3, 4
# Runs are checked for disturbance on the metrics that move least between runs, each with the
# smallest deviation worth calling a disturbance: well above the run-to-run noise seen on the
# H200 (throughput 0.04-0.4%, median ITL under 1%, and 2% between server starts made 15 minutes
# apart). Not median TPOT: on a closed loop it takes one of two values 2-3% apart by how the
# waves arrive, and a run in the rarer mode is not disturbed (the H200 A/A lost one that way).
HEALTH_METRICS = {"output_throughput": 0.02, "median_itl_ms": 0.03}


@dataclass
class ArmAnalysis:
    name: str
    label: str
    backend: str
    servers: list[dict[str, Any]]
    repeats: list[dict[str, Any]]  # vLLM-shaped metrics of each repeat (per-request arrays dropped)
    repeat_data: list[stats.RepeatData]
    block: str  # vLLM result block of the first repeat (what the seed PR pasted)
    accuracy: accuracy.AccuracyResult | None
    accuracy_status: str
    agreement: list[Completion] | None
    agreement_self: list[Completion] | None = None
    raw: list[Any] = field(default_factory=list)  # benchmark.RepeatResult per repeat: records + meta
    server_deltas: list[dict[str, Any] | None] = field(default_factory=list)
    loop_lag_ms: list[dict[str, float]] = field(default_factory=list)
    telemetry: list[Telemetry] = field(default_factory=list)  # NVML summary per repeat
    gpu_series: list[dict] = field(default_factory=list)  # per repeat: GPU -> sampled series (plots)

    @property
    def starts(self) -> int:
        """Server starts with at least one run: the replication unit the intervals are built on."""
        return len({d.start for d in self.repeat_data})

    @property
    def kernels(self) -> list[str | None]:
        return [s.get("selected_kernel") for s in self.servers]


@dataclass
class Analysis:
    run_dir: Path
    run: dict[str, Any]
    scenario: Scenario
    environment: dict[str, Any]
    arms: dict[str, ArmAnalysis]
    comparison: list[stats.MetricComparison]
    agreement: dict[str, Any] | None
    gates: list[GateResult]
    exit_code: int
    notes: list[str]
    noise_floor: list[stats.MetricComparison] | None = None
    agreement_self: dict[str, Any] | None = None
    fidelity: dict[str, Any] | None = None  # to agreement.reference (vse/checks/fidelity.py)
    disturbed: list[dict[str, Any]] = field(default_factory=list)  # every excluded or flagged run
    look: int = 1
    looks: int = 1
    gate_alpha: float = 0.05
    gemm: dict[str, Any] | None = None  # gemm/gemm.json: the GEMM benchmark made with this run (GPU)
    gemm_source: str = "same run"  # or the gemm.json given to `make report GEMM=...`
    gemm_prediction: gemm_predict.Prediction | None = None  # what those kernel timings alone predict
    gemm_prediction_note: str = ""  # why there is no prediction
    sweep: list[tuple[str, "Analysis"]] = field(default_factory=list)  # (point label, its analysis)

    @property
    def complete(self) -> bool:
        return self.run.get("status") == "complete"


# Per-request arrays stay in the raw records: at ISL=OSL=1024 they would make results.json huge.
_ARRAYS = ("input_lens", "output_lens", "ttfts", "itls", "latencies", "start_times", "queue_times", "errors")


def _good_fn(s: Scenario):
    g = s.workload.goodput
    if g is None:
        return None
    return lambda r: all(slo is None or v * 1000 <= slo for slo, v in
                         ((g.ttft_ms, r.ttft_s), (g.tpot_ms, r.tpot_s or 0.0), (g.e2el_ms, r.e2el_s)))


def load_arm(run_dir: Path, name: str, s: Scenario) -> ArmAnalysis | None:
    d = run_dir / name
    if not d.is_dir():
        return None
    spec = getattr(s.arms, name)
    servers = read_json(d / "servers.json") if (d / "servers.json").is_file() else []
    reps = load_repeats(d)
    ran = {r.meta.get("server") for r in reps}
    for sv in servers:  # a start that ran no workload made up checks an interrupted call lost (RESUME)
        sv["measured"] = None in ran or sv.get("server") in ran
    pct = s.workload.percentiles
    per = [repeat_metrics(r, pct, s.workload.goodput) for r in reps]
    starts = [_start_of(r.meta, i, len(reps), len(servers)) for i, r in enumerate(reps)]
    wave = first_wave(s)
    block = metrics.vllm_block(per[0], pct, s.workload.goodput is not None) if per else ""
    tele, series = zip(*[_gpu(d, r.meta, i) for i, r in enumerate(reps)]) if reps else ((), ())
    acc = accuracy.load(d)
    status_file = d / "accuracy" / "status.json"
    acc_status = read_json(status_file)["status"] if status_file.is_file() else ("done" if acc else "not run")
    return ArmAnalysis(
        name=name, label=spec.label, backend=spec.backend.value, servers=servers,
        repeats=[{k: v for k, v in m.items() if k not in _ARRAYS} for m in per],
        repeat_data=[stats.repeat_data(r.records, _good_fn(s), start=st, first_wave=wave, energy_j=t.energy_j)
                     for r, st, t in zip(reps, starts, tele)], block=block,
        accuracy=acc, accuracy_status=acc_status, agreement=agreement.load(d / "agreement.jsonl"),
        agreement_self=agreement.load(d / "agreement-self.jsonl"),
        raw=reps, server_deltas=[r.meta.get("server_metrics_delta") for r in reps],
        loop_lag_ms=[r.meta.get("loop_lag_ms") or {} for r in reps], telemetry=list(tele), gpu_series=list(series))


def first_wave(s: Scenario) -> int | None:
    """Requests in a run's first wave: a concurrency limit's worth, all sent at once when the rate
    is unlimited; None for an open-loop rate, which has no such wave."""
    return s.workload.max_concurrency if s.workload.request_rate == float("inf") else None


def _gpu(arm_dir: Path, meta: dict[str, Any], i: int) -> tuple[Telemetry, dict]:
    """A run's telemetry summary and plotted series, from its raw NVML samples (read once) when the
    run kept them (reports are rebuilt from raw data), else the summary the run recorded."""
    path = arm_dir / f"bench-{meta.get('repeat', i)}.gpu.jsonl"
    if not path.is_file():
        return Telemetry.from_json(meta.get("gpu_telemetry")), {}
    lines = gpu_telemetry.read_samples(path)
    return gpu_telemetry.summarize(lines), gpu_telemetry.series(lines)


def _start_of(meta: dict[str, Any], i: int, n_reps: int, n_servers: int) -> int:
    """The server start a run was measured on. Runs made before starts were recorded: one
    server per arm, or (the old interleaved mode) one server per run."""
    if "server_start" in meta:
        return int(meta["server_start"])
    return i if n_servers == n_reps > 1 else 0


def load_scenario_from_run(run_dir: Path) -> Scenario:
    data = yaml.safe_load((run_dir / "scenario.yaml").read_text())
    gates_ = data.setdefault("gates", {})
    if "agreement_mode" not in gates_:  # made before agreement was a gate: it was reported only
        gates_["agreement_mode"] = "report"
    run = data.get("run") or {}
    if "interleave" in run:  # runs made before server starts were the unit
        interleaved = run.pop("interleave")
        w = data.setdefault("workload", {})
        run["server_starts"] = w.get("repeats", 3) if interleaved else 1
        w["repeats"] = 1 if interleaved else w.get("repeats", 3)
    return Scenario.model_validate(data)


def _workload_differences(s: Scenario, other: Scenario) -> list[str]:
    """What the noise run did differently; a noise floor only holds for the same load."""
    mine, theirs = s.workload.model_dump(mode="json"), other.workload.model_dump(mode="json")
    return [f"{k}: {theirs[k]} there, {mine[k]} here" for k in mine if mine[k] != theirs.get(k)]


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


def _ttft_notes(arms: dict[str, ArmAnalysis]) -> list[str]:
    """Run-level TTFT that falls into two groups, within an arm or across both (where it may also
    be a real difference between the arms): say so, and point at the stable measures."""
    out = []
    defs = [stats.MetricDef(f"{st}_ttft_ms", f"{st} TTFT", False, "ttft", st) for st in ("mean", "median")]
    groups = [(a.name, a.repeat_data) for a in arms.values()]
    if len(arms) == 2:
        groups.append(("both arms together", [d for a in arms.values() for d in a.repeat_data]))
    for name, data in groups:
        for m in defs:
            modes = stats.two_modes([stats.point_value(r, m) for r in data])
            if modes.bimodal:
                out.append(f"{name}: run-level {m.label} falls into two groups ({len(modes.low)} runs near "
                           f"{np.mean(modes.low):,.0f} ms, {len(modes.high)} near {np.mean(modes.high):,.0f} ms; the "
                           f"split explains {modes.r2:.0%} of the variance)" + (
                               ": that can be a real difference between the arms or the workload's run-to-run "
                               "bimodality" if name == "both arms together" else "")
                           + ". Median and mean TTFT verdicts then depend on how many runs land in each group; "
                           "first-wave TTFT (an idle server taking a full burst) is the stable measure of prefill "
                           "speed, TTFT after the first wave the one that moves with the groups.")
                break
    return out


def _machine_notes(arms: dict[str, ArmAnalysis]) -> list[str]:
    """A run resumed on another machine: its machine-to-machine offset is inside the arm difference
    wherever an arm's starts all ran on one machine and the other arm's on another. A start that made
    up lost checks ran no workload: named, but it moves no speed figure."""
    def starts(servers: list[dict]) -> str:  # measured starts numbered on their own: a resume's make-up start comes first
        measured = iter(range(1, len(servers) + 1))
        return ", ".join((f"start {next(measured)}" if sv.get("measured", True) else "checks only")
                         + f" on {sv.get('machine') or 'unrecorded'}" for sv in servers)
    machines = {sv["machine"] for a in arms.values() for sv in a.servers if sv.get("machine")}
    if len(machines) < 2:
        return []
    per_arm = "; ".join(f"{n}: {starts(a.servers)}" for n, a in arms.items())
    return [f"server starts ran on {len(machines)} different machines (a run resumed after the machine was "
            f"given back): {per_arm}. A machine-to-machine offset is part of any arm difference it lines up with."]


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


def analyze(run_dir: Path, *, noise_run: Path | None = None, gemm_file: Path | None = None) -> Analysis:
    run_dir = Path(run_dir)
    s = load_scenario_from_run(run_dir)
    run = read_json(run_dir / "run.json")
    env = read_json(run_dir / "environment.json") if (run_dir / "environment.json").is_file() else {}
    arms = {n: a for n in ARMS if (a := load_arm(run_dir, n, s)) is not None}
    notes: list[str] = []
    g = s.gates
    excluded, disturbed = find_disturbed(arms, s.workload.percentiles)
    look = look_of(s, arms)
    gate_alpha = decide.spent_alpha(g.significance, s.run.server_starts + look - 1, s.run.server_starts,
                                    s.run.max_server_starts)
    comparison: list[stats.MetricComparison] = []
    if all(n in arms and arms[n].repeat_data for n in ARMS):
        comparison = stats.compare_arms(arms["baseline"].repeat_data, arms["candidate"].repeat_data,
                                        s.workload.percentiles, goodput=s.workload.goodput is not None,
                                        alpha=g.significance, excluded=excluded)
    else:
        notes.append("the comparison needs benchmark data from both arms")
    if comparison and comparison[0].design is stats.Design.QUICK_LOOK:
        notes.append("one server start per arm: a quick look. Its intervals ignore start-to-start variation and "
                     "are optimistic; no performance gate is decided from it (they are INCONCLUSIVE).")
    for n in ARMS:
        if getattr(s.arms, n).whatif:  # first, in every report format
            notes.insert(0, f"{n} ({getattr(s.arms, n).label}) is a **{whatif.LABEL}**: FlashInfer's per-tensor FP8 "
                            f"GEMM below compute capability 10.0, enabled by the suite's vLLM plugin. "
                            + whatif.TACTICS_NOTE[whatif.tactics_mode(arms[n].servers if n in arms else [],
                                                                      getattr(s.arms, n))])
    notes += _ttft_notes(arms) + _machine_notes(arms)
    agree = self_agree = None
    if all(n in arms and arms[n].agreement for n in ARMS):
        agree = agreement.compare(arms["baseline"].agreement, arms["candidate"].agreement)
    if "baseline" in arms and arms["baseline"].agreement and arms["baseline"].agreement_self:
        self_agree = agreement.compare(arms["baseline"].agreement, arms["baseline"].agreement_self)
    for a in arms.values():
        cpt = [m.get("chunks_per_token") for m in a.repeats if m.get("chunks_per_token")]
        if cpt and min(cpt) < 0.9:
            notes.append(f"{a.name}: the server coalesced tokens (as few as {min(cpt):.2f} chunks per token), so "
                         "its ITL measures gaps between chunks, not tokens: compare TPOT. (vLLM sends no chunk for "
                         "a token that decodes to no new text, common with random weights, and merges a stream's "
                         "pending tokens into one chunk when its API server falls behind at high token rates.)")
    results: list[GateResult] = []
    for n, a in arms.items():
        if a.repeat_data:
            total = sum(d.n + d.failed for d in a.repeat_data)
            errors = [r.error for rep in a.raw for r in sorted(metrics.measured(rep.records), key=lambda x: x.end_ns)
                      if not r.success]
            results.append(gates.failed_requests(n, sum(d.failed for d in a.repeat_data), total,
                                                 g.max_failed_fraction, gates.error_kinds(errors)))
    results += _accuracy_gates(s, run, arms)
    fid = fidelity.from_run(run_dir, g.significance) if s.agreement.reference else None
    if s.agreement.enabled:
        results += gates.agreement(agree, self_agree, g, pending=bool(run.get("stopped")))
        if s.agreement.reference:
            results += gates.fidelity(fid, g, s.agreement.reference.label, pending=bool(run.get("stopped")))
    results += gates.performance(comparison, g, gate_alpha)
    noise = None
    if noise_run is not None:
        na = analyze(noise_run)
        noise = na.comparison
        if differ := _workload_differences(s, na.scenario):
            notes.append(f"the A/A run {noise_run.name} had another workload ({'; '.join(differ)}): its intervals "
                         "are not this run's noise floor, only an indication")
    status = run.get("status")
    if status != "complete":
        notes.insert(0, f"run {status}: {run.get('reason') or 'no reason recorded'}")
    # A load sweep's points are run directories of their own (vse/sweep.py), each with its verdict,
    # and with the run's GEMM timings: what the kernels alone predict at each load is the sweep's "why".
    own = run_dir / "gemm" / "gemm.json"
    gemm_path = gemm_file if gemm_file is not None else own if own.is_file() else None
    points = [(label, analyze(d, gemm_file=gemm_path)) for label, d in sweep.point_dirs(run_dir, s)
              if (d / "run.json").is_file()]
    code = sweep.worst_exit([exit_code_for(status, results)] + [p.exit_code for _, p in points])
    out = Analysis(run_dir, run, s, env, arms, comparison, agree, results, code, notes, noise,
                   agreement_self=self_agree, fidelity=fid, disturbed=disturbed, look=look, looks=s.run.looks,
                   gate_alpha=gate_alpha, sweep=points)
    if gemm_path is not None:
        out.gemm = read_json(gemm_path)
        out.gemm_source = str(gemm_file) if gemm_file is not None else "same run"
        _predict(out, gemm_file)
    return out


def _predict(a: Analysis, gemm_file: Path | None) -> None:
    """The kernels-only prediction beside the measured change (vse/gemm/predict.py)."""
    s, base = a.scenario, a.arms.get("baseline")
    gpu_run = ", ".join(g.get("name", "") for g in a.environment.get("gpus", []))
    if gemm_file is not None and a.gemm.get("gpu") and a.gemm["gpu"] not in gpu_run:
        a.gemm_prediction_note = f"the GEMM timings were made on {a.gemm['gpu']}, this run on {gpu_run or 'no GPU'}"
        return
    if base is None or "candidate" not in a.arms:
        a.gemm_prediction_note = "the prediction needs both arms' benchmark data"
        return
    wave = first_wave(s)
    a.gemm_prediction, a.gemm_prediction_note = gemm_predict.for_run(
        models.model_config(s.model), s.server.tensor_parallel_size, a.gemm, [r.records for r in base.raw],
        base.backend, a.arms["candidate"].backend, wave, gemm_predict.server_steps(base.server_deltas))


def _random_weights(run: dict[str, Any], s: Scenario) -> bool:
    return bool(run.get("weights_random", s.model.weights_are_random))


def fmt_pct(x: float) -> str:
    return "n/a" if x is None or not math.isfinite(x) else f"{100 * x:+.2f}%"
