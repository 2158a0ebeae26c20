"""Multi-turn sessions: how many turns each has and how long its user thinks (the plan: the same in
every run, from SessionSpec's own seed, so every run of both arms has one structure), and real
conversations read from a JSONL (one line naming the file and line where a line is not one).
The turns' texts and lengths are the run's (eval/vse/loadgen/datasets.py)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from vse.errors import ScenarioError
from vse.scenario import DatasetSpec
from vse.scenario.trace import json_objects

PLAN_SEED = 0x5E55  # the plan's stream, apart from the texts' (dataset.seed + run)


@dataclass(frozen=True)
class SessionPlan:
    turns: int
    start_s: float  # after the run's start (sessions arrive at SessionSpec.rate)
    think_s: tuple[float, ...]  # before each turn after the first


def conversations(path: str, count: int) -> list[list[str]]:
    """The user turns of the file's first `count` conversations."""
    out: list[list[str]] = []
    for _n, where, row in json_objects(path):
        turns = row.get("turns")
        if turns is None and isinstance(row.get("messages"), list):
            turns = [m.get("content") for m in row["messages"] if isinstance(m, dict) and m.get("role") == "user"]
        if not isinstance(turns, list) or not turns or not all(isinstance(t, str) and t for t in turns):
            raise ScenarioError(
                f'{where}: a conversation is {{"turns": ["user text", ...]}} or '
                '{"messages": [{"role": "user", "content": ...}, ...]} with at least one user turn'
            )
        out.append(turns)
        if len(out) == count:
            break
    if not out:
        raise ScenarioError(f"{path}: no conversation in it")
    return out


def plan(spec: DatasetSpec) -> list[SessionPlan]:
    """Every session's turns, start and think times."""
    c = spec.conversation
    rng = np.random.default_rng([PLAN_SEED, c.seed])
    if spec.path:
        counts = [len(t) for t in conversations(spec.path, c.count)]
    else:
        counts = rng.integers(c.min_turns, c.max_turns + 1, size=c.count).tolist()
    gaps = rng.exponential(1.0 / c.rate, size=len(counts)) if np.isfinite(c.rate) else np.zeros(len(counts))
    gaps[0] = 0.0
    starts = np.cumsum(gaps)
    return [
        SessionPlan(
            int(k),
            float(t),
            tuple(float(x) for x in rng.exponential(c.think_s, size=k - 1)) if c.think_s else (0.0,) * (k - 1),
        )
        for k, t in zip(counts, starts)
    ]


def resolve(where: Path, spec: DatasetSpec, num_prompts: int | None) -> int:
    """The run's requests: every turn of every session (num_prompts, where set, must say as much)."""
    total = sum(p.turns for p in plan(spec))
    if num_prompts is not None and num_prompts != total:
        raise ScenarioError(
            f"{where}: workload.num_prompts is {num_prompts}, but the sessions have {total} turns; "
            "leave num_prompts out (a sessions run sends every turn)"
        )
    return total
