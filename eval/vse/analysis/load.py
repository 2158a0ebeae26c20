"""Loading a run directory into per-arm data: servers, runs, per-request arrays, telemetry,
accuracy and agreement records. Reads raw data only."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from vse.errors import DamagedRunError, SuiteError
from vse.quality import accuracy, agreement
from vse.quality.agreement import Completion
from vse.rundir.files import read_json
from vse.rundir.layout import ArmDir, RunDir
from vse.rundir.rawdata import load_repeats
from vse.rundir.records import RequestRecord
from vse.scenario import ARMS, DatasetKind, Scenario
from vse.scenario.load import parse_override, set_path
from vse.stats import estimate, metrics
from vse.stats import telemetry as gpu_telemetry
from vse.stats.metrics import repeat_metrics
from vse.stats.telemetry import Telemetry


@dataclass
class ArmAnalysis:
    name: str
    label: str
    backend: str
    servers: list[dict[str, Any]]
    repeats: list[dict[str, Any]]  # vLLM-shaped metrics of each repeat (per-request arrays dropped)
    repeat_data: list[estimate.RepeatData]
    block: str  # vLLM result block of the first repeat (what the seed PR pasted)
    accuracy: accuracy.AccuracyResult | None
    accuracy_status: str
    agreement: list[Completion] | None
    agreement_self: list[Completion] | None = None
    repeats_detailed: list[dict[str, Any]] = field(default_factory=list)  # the same with the arrays (vLLM files)
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

    @property
    def releases(self) -> list[str]:
        """The vLLM versions this arm's servers announced at their starts (none recorded before 0.3)."""
        return sorted({v for s in self.servers if (v := s.get("vllm_version"))})


def _good_fn(s: Scenario) -> Callable[[RequestRecord], bool] | None:
    g = s.workload.goodput
    if g is None:
        return None
    return lambda r: all(
        slo is None or v * 1000 <= slo
        for slo, v in ((g.ttft_ms, r.ttft_s), (g.tpot_ms, r.tpot_s or 0.0), (g.e2el_ms, r.e2el_s))
    )


def load_arm(run_dir: Path, name: str, s: Scenario) -> ArmAnalysis | None:
    layout = RunDir(run_dir)
    status = read_json(layout.run_json) if layout.run_json.is_file() else {}
    arm, complete = layout.arm(name), status.get("status") == "complete"
    d = arm.path
    if not d.is_dir():
        other = [a for a in ARMS if a != name and layout.arm(a).path.is_dir()]
        if complete and other and not status.get("stopped"):  # a finished A/B has both arms; a budget stop may not
            raise DamagedRunError(f"{d}: missing, beside {other[0]}/; the run directory is damaged")
        return None
    spec = getattr(s.arms, name)
    servers = read_json(arm.servers) if arm.servers.is_file() else []
    reps = load_repeats(d, complete=complete, usage_per_chunk=spec.workload(s.workload).usage_per_chunk)
    if complete and reps and not servers:
        raise DamagedRunError(f"{arm.servers}: missing (the arm ran {len(reps)} run(s)); the run directory is damaged")
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
    status_file = arm.accuracy_status
    acc_status = read_json(status_file)["status"] if status_file.is_file() else ("done" if acc else "not run")
    return ArmAnalysis(
        name=name,
        label=spec.label,
        backend=spec.backend.value,
        servers=servers,
        # per-request arrays stay in the raw records: at ISL=OSL=1024 they would make results.json huge
        repeats=[{k: v for k, v in m.items() if k not in metrics.PER_REQUEST} for m in per],
        repeats_detailed=per,
        repeat_data=[
            _without_preempted_decode(
                estimate.repeat_data(r.records, _good_fn(s), start=st, first_wave=wave, energy_j=t.energy_j), r.meta
            )
            for r, st, t in zip(reps, starts, tele)
        ],
        block=block,
        accuracy=acc,
        accuracy_status=acc_status,
        agreement=agreement.load(arm.agreement),
        agreement_self=agreement.load(arm.agreement_self),
        raw=reps,
        server_deltas=[_engine_steps_only_where_counted(r.meta, servers) for r in reps],
        loop_lag_ms=[r.meta.get("loop_lag_ms") or {} for r in reps],
        telemetry=list(tele),
        gpu_series=list(series),
    )


PREEMPTIONS = "vllm:num_preemptions_total"
# vLLM's step histogram is kept by each API-server process for the steps that carried its own
# requests: with several processes one engine step counts up to once per process, its tokens split
# between them, so the count is not the engine's (docs/measurements.md, "One API-server process or
# two").
ITERATIONS = "vllm:iteration_tokens_total"


def api_servers(argv: Sequence[str]) -> int:
    """How many API-server processes a `vllm serve` command line asked for (1 unless it says)."""
    for i, a in enumerate(argv):
        name, _, value = a.partition("=")
        if name in ("--api-server-count", "-asc"):
            value = value or (argv[i + 1] if i + 1 < len(argv) else "")
            return int(value) if value.isdigit() else 1
    return 1


def _engine_steps_only_where_counted(meta: dict[str, Any], servers: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The run's /metrics deltas, without the step histogram where its server ran several API-server
    processes (ITERATIONS): readings built on engine steps then say they have none."""
    delta = meta.get("server_metrics_delta")
    argv = next((sv.get("argv") or [] for sv in servers if sv.get("server") == meta.get("server")), [])
    if not delta or api_servers(argv) <= 1:
        return delta
    return {k: v for k, v in delta.items() if not k.startswith(ITERATIONS)}


def _without_preempted_decode(d: estimate.RepeatData, meta: dict[str, Any]) -> estimate.RepeatData:
    """A run in which the server preempted a request has no first-wave decode value: the recompute
    of a preempted request's prefill can fall inside the pure-decode window and slow the arm it
    happened to (docs/statistics.md). The server's counter is per run, not per step, so any
    preemption in the run takes the value out, with the reason."""
    n = (meta.get("server_metrics_delta") or {}).get(PREEMPTIONS) or 0
    if n <= 0 or not d.decode_first.size:
        return d
    why = f"{n:.0f} preemption(s) during the run ({PREEMPTIONS}): a recomputed prefill can sit in the window"
    return dataclasses.replace(d, decode_first=np.array([]), decode_first_why=why)


def starts_made(arms: dict[str, ArmAnalysis]) -> tuple[int, int]:
    """Server starts with a run, baseline and candidate (0 for an arm not there)."""
    b, c = (arms[n].starts if n in arms else 0 for n in ARMS)
    return b, c


def first_wave(s: Scenario) -> int | None:
    """Requests in a run's first wave: a concurrency limit's worth, all sent at once when the rate
    is unlimited; None for an open-loop rate or a replayed trace (its requests come due on the
    trace's clock), which have no such wave."""
    if s.workload.dataset.kind == DatasetKind.TRACE:
        return None
    return s.workload.max_concurrency if s.workload.request_rate == float("inf") else None


def _gpu(arm_dir: Path, meta: dict[str, Any], i: int) -> tuple[Telemetry, dict]:
    """A run's telemetry summary and plotted series, from its raw NVML samples (read once) when the
    run kept them (reports are rebuilt from raw data), else the summary the run recorded."""
    path = ArmDir(arm_dir).gpu_samples(meta.get("repeat", i))
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


def load_scenario_from_run(run_dir: Path, regate: Sequence[str] = ()) -> Scenario:
    """The scenario the run was made with (sealed with it); `regate` (KEY=VALUE, gates.* keys only)
    decides it with other gate settings, which every report then names (analysis/run.py)."""
    path = RunDir(run_dir).scenario
    if not path.is_file():
        raise DamagedRunError(f"{path}: missing; the run directory is damaged (it holds the settings it was run with)")
    data = yaml.safe_load(path.read_text())
    for item in regate:
        key, value = parse_override(item)
        if not key.startswith("gates."):
            raise SuiteError(
                f"--regate {item}: only gates.* settings can differ from the run's; the rest is what it measured"
            )
        set_path(data, key, value)
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
