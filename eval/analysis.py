"""From a run directory to conclusions: per-arm metrics per repeat, the comparison with
intervals and verdicts, accuracy and agreement, gates and the exit code. Reads raw data
only, so `make report` can rebuild everything without a server."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from . import accuracy, agreement, gates, metrics, stats
from .benchmark import load_repeats, repeat_metrics
from .gates import GateResult, Outcome
from .rundir import read_json
from .scenario import Scenario

ARMS = ("baseline", "candidate")
EXIT_OK, EXIT_GATE_FAILED, EXIT_RUN_FAILED = 0, 1, 2


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
    agreement: list[agreement.Completion] | None
    raw: list[Any] = field(default_factory=list)  # benchmark.RepeatResult per repeat: records + meta
    server_deltas: list[dict[str, Any] | None] = field(default_factory=list)
    loop_lag_ms: list[dict[str, float]] = field(default_factory=list)

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
    pct = s.workload.percentiles
    per = [repeat_metrics(r, pct, s.workload.goodput) for r in reps]
    block = metrics.vllm_block(per[0], pct, s.workload.goodput is not None) if per else ""
    acc = accuracy.load(d)
    status_file = d / "accuracy" / "status.json"
    acc_status = read_json(status_file)["status"] if status_file.is_file() else ("done" if acc else "not run")
    return ArmAnalysis(
        name=name, label=spec.label, backend=spec.backend.value, servers=servers,
        repeats=[{k: v for k, v in m.items() if k not in _ARRAYS} for m in per],
        repeat_data=[stats.repeat_data(r.records, _good_fn(s)) for r in reps], block=block,
        accuracy=acc, accuracy_status=acc_status, agreement=agreement.load(d / "agreement.jsonl"),
        raw=reps, server_deltas=[r.meta.get("server_metrics_delta") for r in reps],
        loop_lag_ms=[r.meta.get("loop_lag_ms") or {} for r in reps])


def load_scenario_from_run(run_dir: Path) -> Scenario:
    return Scenario.model_validate(yaml.safe_load((run_dir / "scenario.yaml").read_text()))


def _workload_differences(s: Scenario, other: Scenario) -> list[str]:
    """What the noise run did differently; a noise floor only holds for the same load."""
    mine, theirs = s.workload.model_dump(mode="json"), other.workload.model_dump(mode="json")
    return [f"{k}: {theirs[k]} there, {mine[k]} here" for k in mine if mine[k] != theirs.get(k)]


def analyze(run_dir: Path, *, noise_run: Path | None = None, bootstrap: int = 2000) -> Analysis:
    run_dir = Path(run_dir)
    s = load_scenario_from_run(run_dir)
    run = read_json(run_dir / "run.json")
    env = read_json(run_dir / "environment.json") if (run_dir / "environment.json").is_file() else {}
    arms = {n: a for n in ARMS if (a := load_arm(run_dir, n, s)) is not None}
    notes: list[str] = []
    g = s.gates
    comparison: list[stats.MetricComparison] = []
    if all(n in arms and arms[n].repeat_data for n in ARMS):
        comparison = stats.compare_arms(arms["baseline"].repeat_data, arms["candidate"].repeat_data,
                                        s.workload.percentiles, goodput=s.workload.goodput is not None,
                                        alpha=g.significance, b=bootstrap)
    else:
        notes.append("the comparison needs benchmark data from both arms")
    agree = None
    if all(n in arms and arms[n].agreement for n in ARMS):
        agree = agreement.compare(arms["baseline"].agreement, arms["candidate"].agreement)
    for a in arms.values():
        cpt = [m.get("chunks_per_token") for m in a.repeats if m.get("chunks_per_token")]
        if cpt and min(cpt) < 0.9:
            notes.append(f"{a.name}: the server coalesced tokens (as few as {min(cpt):.2f} chunks per token), so "
                         "its ITL measures gaps between chunks, not tokens: compare TPOT. (vLLM sends no chunk for "
                         "a token that decodes to no new text, common with random weights, and merges a stream's "
                         "pending tokens into one chunk when its API server falls behind at high token rates.)")
    results: list[GateResult] = []
    if s.accuracy.enabled and not _random_weights(run, s):
        accs = {n: arms[n].accuracy if n in arms else None for n in ARMS}
        for n in ARMS:
            a = accs[n]
            if a is None:
                results.append(GateResult(f"{n} accuracy", Outcome.FAIL,
                                          arms[n].accuracy_status if n in arms else "arm did not run"))
                continue
            results += gates.sample_counts(n, a, s.accuracy)
            results += gates.accuracy_reference(n, a, s.accuracy, g.accuracy_reference_rtol)
        if accs["baseline"] and accs["candidate"]:
            results += gates.accuracy_noninferiority(accs["baseline"], accs["candidate"], g)
    elif s.accuracy.enabled:
        results.append(GateResult("accuracy", Outcome.NOT_APPLICABLE,
                                  "model weights are random (load_format: dummy): accuracy was not measured"))
    if s.agreement.enabled:
        results += gates.agreement(agree, g)
    results += gates.performance(comparison, g)
    noise = None
    if noise_run is not None:
        na = analyze(noise_run, bootstrap=bootstrap)
        noise = na.comparison
        if differ := _workload_differences(s, na.scenario):
            notes.append(f"the A/A run {noise_run.name} had another workload ({'; '.join(differ)}): its intervals "
                         "are not this run's noise floor, only an indication")
    status = run.get("status")
    if status != "complete":
        code = EXIT_RUN_FAILED
        notes.insert(0, f"run {status}: {run.get('reason') or 'no reason recorded'}")
    elif any(r.outcome == Outcome.FAIL for r in results):
        code = EXIT_GATE_FAILED
    else:
        code = EXIT_OK
    return Analysis(run_dir, run, s, env, arms, comparison, agree, results, code, notes, noise)


def _random_weights(run: dict[str, Any], s: Scenario) -> bool:
    return bool(run.get("weights_random", s.model.weights_are_random))


def fmt_pct(x: float) -> str:
    return "n/a" if x is None or not math.isfinite(x) else f"{100 * x:+.2f}%"
