"""A staged load's metrics stage by stage: every run's requests split by the stage they were sent in,
each part measured as a run is (stats/metrics.py's compute: the same keys), then per arm and stage the
mean over runs. A step or ramp shows where the server stops keeping up, stage by stage."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from vse.analysis.load import ArmAnalysis
from vse.scenario import Scenario
from vse.stats import metrics, registry

# The measures the summary's table shows (results.json has every metric of each stage and run).
SHOWN = (
    registry.REQUEST_THROUGHPUT,
    registry.OUTPUT_THROUGHPUT,
    registry.MEDIAN_TTFT,
    registry.P99_TTFT,
    registry.MEDIAN_TPOT,
    registry.P99_TPOT,
)


@dataclass(frozen=True)
class StageRow:
    arm: str
    stage: int
    label: str  # the stage's load and duration
    runs: int
    requests: int  # over its runs
    mean: dict[str, float]  # metric key -> mean over the runs (nan where no run has a value)
    per_run: list[dict[str, Any]]  # each run's metrics of this stage (per-request arrays dropped)


def stage_view(s: Scenario, arms: dict[str, ArmAnalysis]) -> list[StageRow] | None:
    """Per arm and stage, the stage's metrics (None for a load without stages)."""
    w = s.workload
    if not w.stages:
        return None
    rows: list[StageRow] = []
    for name, arm in arms.items():
        for i, st in enumerate(w.stages):
            per_run = []
            for rep in arm.raw:
                part = [r for r in rep.records if r.phase == "measure" and r.stage == i]
                if part:
                    m = metrics.compute(part, w.percentiles, w.goodput, st.max_concurrency, st.request_rate or np.inf)
                    per_run.append({k: v for k, v in m.items() if k not in metrics.PER_REQUEST})
            mean = {k: _mean([r.get(k) for r in per_run]) for k in SHOWN}
            rows.append(
                StageRow(
                    name, i, st.label, len(per_run), sum(r["completed"] + r["failed"] for r in per_run), mean, per_run
                )
            )
    return rows


def _mean(values: list[Any]) -> float:
    v = [float(x) for x in values if isinstance(x, (int, float)) and np.isfinite(x)]
    return float(np.mean(v)) if v else float("nan")
