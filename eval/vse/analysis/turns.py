"""A sessions run's TTFT by turn index: a prefix-cache regression shows on later turns first (each
carries every earlier turn and answer, which a working cache serves without prefill)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vse.analysis.load import ArmAnalysis
from vse.scenario import DatasetKind, Scenario


@dataclass(frozen=True)
class TurnRow:
    arm: str
    turn: int  # 1-based
    requests: int  # successful, over the arm's runs
    median_ttft_ms: float
    p99_ttft_ms: float
    mean_prompt_tokens: float  # as the server counted them (the history grows turn by turn)


def turn_view(s: Scenario, arms: dict[str, ArmAnalysis]) -> list[TurnRow] | None:
    if s.workload.dataset.kind != DatasetKind.SESSIONS:
        return None
    rows: list[TurnRow] = []
    for name, arm in arms.items():
        ok = [r for rep in arm.raw for r in rep.records if r.phase == "measure" and r.success and r.turn is not None]
        for t in sorted({r.turn for r in ok if r.turn is not None}):
            these = [r for r in ok if r.turn == t]
            ttft = np.asarray([r.ttft_s * 1e3 for r in these])
            tokens = [r.usage_prompt_tokens if r.usage_prompt_tokens is not None else r.prompt_len for r in these]
            rows.append(
                TurnRow(
                    name,
                    t + 1,
                    len(these),
                    float(np.median(ttft)),
                    float(np.percentile(ttft, 99)),
                    float(np.mean(tokens)),
                )
            )
    return rows
