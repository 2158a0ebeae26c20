"""Raw records as the run directory holds them: a repeat's per-request records and settings,
and its vLLM-shaped metrics. What analysis and reports read; no load generator needed."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vse.rundir.files import read_json
from vse.rundir.records import RequestRecord, read_jsonl
from vse.stats import metrics


@dataclass
class RepeatResult:
    records: list[RequestRecord]
    meta: dict[str, Any]


def load_repeats(arm_dir: Path) -> list[RepeatResult]:
    """Every finished repeat in an arm's directory (a repeat is finished once its meta exists)."""
    out = []
    for meta_path in sorted(arm_dir.glob("bench-*.meta.json"), key=lambda p: int(p.name.split("-")[1].split(".")[0])):
        recs = meta_path.with_name(meta_path.name.replace(".meta.json", ".jsonl"))
        if recs.is_file():
            out.append(RepeatResult(read_jsonl(recs), read_json(meta_path)))
    return out


def repeat_metrics(r: RepeatResult, w_percentiles: list[float], goodput=None) -> dict[str, Any]:
    m = r.meta
    rate = m.get("request_rate")
    return metrics.compute(r.records, w_percentiles, goodput, m.get("max_concurrency"),
                           math.inf if rate is None else rate)
