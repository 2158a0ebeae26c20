"""results.json: versioned, everything in the summary plus run metadata. The per-repeat
entries under arms.*.vllm_results use `vllm bench serve --save-result` keys, so vLLM's own
comparison scripts can read them (per-request arrays live in the raw records instead)."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

from vse import __version__
from vse.analysis import Analysis, analyze
from vse.report import sweep, vllm_files
from vse.rundir import seal
from vse.rundir.files import read_json
from vse.rundir.layout import RunDir
from vse.scenario import dump
from vse.stats import estimate, registry

SCHEMA_VERSION = 2  # 2: arms.*.runs (every metric of every run) and raw_files (what it was computed from)


def _clean(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if hasattr(x, "value") and not isinstance(x, (int, float, str)):
        return x.value
    return x


def render(a: Analysis) -> dict[str, Any]:
    arms = {}
    w = a.scenario.workload
    defs = registry.metric_defs(w.percentiles, w.goodput is not None, energy=True)
    for name, arm in a.arms.items():
        spec = getattr(a.scenario.arms, name)
        vllm_results = [vllm_files.result_json(a, arm, k, m, detailed=False)[0] for k, m in enumerate(arm.repeats)]
        arms[name] = {
            "label": arm.label,
            "backend": arm.backend,
            "servers": arm.servers,
            "selected_kernels": arm.kernels,
            "vllm_results": vllm_results,
            "vllm_block_repeat1": arm.block,
            "accuracy": dataclasses.asdict(arm.accuracy) if arm.accuracy else None,
            "accuracy_status": arm.accuracy_status,
            "server_metrics_deltas": arm.server_deltas,
            "loop_lag_ms": arm.loop_lag_ms,
            "extra_args": spec.extra_args,
            "whatif": spec.whatif,
            "gpu_telemetry": [t.to_json() for t in arm.telemetry],  # per repeat
            # every run-level metric of every run (the history's rows; what the comparison's start means are made of)
            "runs": [
                {"server_start": d.start, "metrics": {m.key: estimate.point_value(d, m) for m in defs}}
                for d in arm.repeat_data
            ],
        }
    return _clean(
        {
            "schema_version": SCHEMA_VERSION,
            "suite_version": __version__,
            "run": a.run,
            "run_dir": str(a.run_dir),
            "scenario": dump(a.scenario),
            "environment": a.environment,
            "arms": arms,
            "comparison": [dataclasses.asdict(r) for r in a.comparison],
            "noise_floor": [dataclasses.asdict(r) for r in a.noise_floor] if a.noise_floor else None,
            "agreement": a.agreement,
            "agreement_self": a.agreement_self,
            "fidelity": a.fidelity,
            "design": {
                "server_starts": {n: arm.starts for n, arm in a.arms.items()},
                "look": a.look,
                "looks": a.looks,
                "gate_alpha": a.gate_alpha,
            },
            "disturbed_runs": a.disturbed,
            # a replayed trace's send lag and prefix-cache reuse per run (only such runs have the key)
            **({"replay": dataclasses.asdict(a.replay)} if a.replay is not None else {}),
            **({"stages": [dataclasses.asdict(r) for r in a.stages]} if a.stages is not None else {}),
            **({"turns": [dataclasses.asdict(r) for r in a.turns]} if a.turns is not None else {}),
            "left_out": a.left_out,
            "sweep": sweep.json_rows(a),
            "gemm_prediction": (
                {"gemm_source": a.gemm_source, **a.gemm_prediction.to_json()}
                if a.gemm_prediction
                else {"gemm_source": a.gemm_source, "none": a.gemm_prediction_note}
                if a.gemm
                else None
            ),
            "gates": [dataclasses.asdict(g) for g in a.gates],
            "notes": a.notes,
            "exit_code": a.exit_code,
            "raw_files": RunDir(a.run_dir).raw_files() if a.run_dir.is_dir() else {},
        }
    )


def current(run_dir: Path) -> dict[str, Any]:
    """The run's results.json if it describes the raw data beside it now, else the same document
    computed from the raw records (which refuses a damaged run, naming the file). Sizes alone
    cannot tell an edited record from the one the report read: a sealed run is checked first."""
    layout = RunDir(run_dir)
    if layout.results.is_file():
        try:
            res = read_json(layout.results)
        except ValueError:
            res = {}
        if res.get("schema_version", 0) >= 2 and res.get("raw_files") == layout.raw_files():
            seal.verify(run_dir)  # (analyze, below, checks the seal itself)
            return res
    return render(analyze(run_dir))
