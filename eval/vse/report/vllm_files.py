"""Results in the forms other tools read: one file per measured run exactly as `vllm bench serve
--save-result` writes it (with --save-detailed: its per-request arrays too), under
<run>/<arm>/vllm/bench-K.json, so vLLM's own scripts and dashboards take a suite run as they take
theirs; and results.csv, one row per run and metric, for a spreadsheet or a database load."""

from __future__ import annotations

import csv
import io
import math
from datetime import datetime

from vse.analysis import Analysis
from vse.analysis.load import ArmAnalysis
from vse.rundir.files import write_json
from vse.rundir.layout import RunDir
from vse.stats import estimate, metrics, registry

CSV_FIELDS = ("run", "arm", "label", "backend", "repeat", "server_start", "metric", "value")


def result_json(a: Analysis, arm: ArmAnalysis, m: dict, detailed: bool) -> dict:
    """One run as `vllm bench serve --save-result` writes it (detailed: with per-request arrays)."""
    w = a.scenario.workload
    return metrics.vllm_result_json(
        m,
        label=arm.label,
        model_id=a.scenario.model.served_name,
        tokenizer_id=tokenizer_id(arm),
        num_prompts=w.num_prompts,
        endpoint=w.endpoint.value,
        burstiness=w.burstiness,
        detailed=detailed,
        date=vllm_date(a.run.get("started")),
    )


def vllm_date(iso: str | None) -> str | None:
    """vLLM's own `date` (%Y%m%d-%H%M%S) from the run's start (ISO 8601, UTC)."""
    try:
        return datetime.fromisoformat(str(iso)).strftime("%Y%m%d-%H%M%S")
    except ValueError:
        return None


def tokenizer_id(arm: ArmAnalysis) -> str:
    """What vLLM writes there: the tokenizer it was given, else the model (the arm's server's)."""
    argv = arm.servers[0].get("argv", []) if arm.servers else []
    for flag in ("--tokenizer", "--model"):
        if flag in argv[:-1]:
            return str(argv[argv.index(flag) + 1])
    return ""


def write(a: Analysis, detailed: bool = False) -> None:
    """vLLM's result file for every run of every arm (the one-file-per-run format)."""
    for name, arm in a.arms.items():
        out = RunDir(a.run_dir).arm(name)
        for k, m in enumerate(arm.repeats_detailed):
            write_json(out.vllm_result(k), result_json(a, arm, m, detailed))


def csv_text(a: Analysis) -> str:
    w = a.scenario.workload
    defs = registry.metric_defs(w.percentiles, w.goodput is not None, energy=True)
    buf = io.StringIO()
    out = csv.writer(buf, lineterminator="\n")
    out.writerow(CSV_FIELDS)
    for name, arm in a.arms.items():
        for k, d in enumerate(arm.repeat_data):
            for m in defs:
                if math.isfinite(v := estimate.point_value(d, m)):
                    out.writerow((a.run_dir.name, name, arm.label, arm.backend, k, d.start, m.key, f"{v:.6g}"))
    return buf.getvalue()
