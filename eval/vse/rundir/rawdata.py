"""Raw records as the run directory holds them: a repeat's per-request records and settings,
and its vLLM-shaped metrics. What analysis and reports read; no load generator needed."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vse.errors import DamagedRunError
from vse.rundir.files import read_json
from vse.rundir.layout import ArmDir
from vse.rundir.records import RequestRecord, read_jsonl
from vse.stats import metrics


@dataclass
class RepeatResult:
    records: list[RequestRecord]
    meta: dict[str, Any]


def load_repeats(arm_dir: Path, complete: bool = True) -> list[RepeatResult]:
    """Every finished repeat in an arm's directory (a repeat is finished once its meta exists, which
    is written after its records). In a run that says it completed, records and metas must pair up:
    a missing one is a damaged run, refused with the file named (a run silently left out moved
    every figure while the verdict stayed PASS). An interrupted run may end with records whose meta
    was never written: that last run is left out."""
    arm = ArmDir(arm_dir)
    metas, records = arm.metas(), arm.record_files()
    if complete:
        for k in sorted(set(metas) ^ set(records)):
            have, missing = (records[k], arm.meta(k).name) if k in records else (metas[k], arm.records(k).name)
            raise DamagedRunError(
                f"{have}: its {missing} is missing; the run directory is damaged (the run said it completed)"
            )
    out = []
    for k in sorted(metas):
        if k in records:
            try:
                meta = read_json(metas[k])
            except ValueError as e:
                raise DamagedRunError(f"{metas[k]}: not JSON ({e}); the run directory is damaged") from None
            out.append(RepeatResult(read_jsonl(records[k]), meta))
    return out


def repeat_metrics(r: RepeatResult, w_percentiles: list[float], goodput=None) -> dict[str, Any]:
    m = r.meta
    rate = m.get("request_rate")
    return metrics.compute(
        r.records, w_percentiles, goodput, m.get("max_concurrency"), math.inf if rate is None else rate
    )
