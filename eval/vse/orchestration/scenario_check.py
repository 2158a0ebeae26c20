"""A scenario as a run needs it: read and validated (vse.scenario.load), then every free-form name
checked against what the suite knows: gated metrics against the metric registry, accuracy tasks
against the suite's own and lm-eval's. The scenario layer sits below the statistics and the checks,
so this last step lives here, where both are in reach."""

from __future__ import annotations

import difflib
import importlib.util
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from vse.errors import PreflightError, ScenarioError
from vse.paths import scenario_path
from vse.quality.small_tasks import TASKS
from vse.scenario import Scenario
from vse.scenario.load import read_scenario
from vse.server import preflight
from vse.stats.registry import metric_defs

# `make compare` with no SCENARIO: the seed PR's comparison where a GPU is visible, the CPU smoke
# comparison where none is. With no hub access the seed's model cannot be had; its shapes can.
DEFAULT = "default"
CPU_DEFAULT = "scenarios/cpu-smoke.yaml"
GPU_SEED = "scenarios/llama3-8b-fp8-isl1024-osl1024-c128.yaml"
GPU_STANDIN = "scenarios/h200-llama3.1-8b-fp8-dummy.yaml"


def default_scenario(log: Callable[[str], None]) -> str:
    """The scenario DEFAULT names on this machine, said in one line."""
    if not preflight.query_gpus():
        return CPU_DEFAULT
    try:
        preflight.check_model(read_scenario(GPU_SEED))
    except PreflightError as e:
        log(
            f"scenario: a GPU is visible; the seed PR's model cannot be had here ({e}): "
            f"the same shapes from generated weights, {GPU_STANDIN}"
        )
        return GPU_STANDIN
    log(f"scenario: a GPU is visible: the seed PR's comparison, {GPU_SEED}")
    return GPU_SEED


def _said(m: str) -> None:
    print(m, file=sys.stderr, flush=True)


def load_scenario(
    path: str | Path,
    *,
    backend: str | None = None,
    overrides: Sequence[str] = (),
    log: Callable[[str], None] = _said,
) -> Scenario:
    """The scenario at path (DEFAULT: chosen by this machine) with BACKEND and SET applied,
    validated, and its names checked."""
    if str(path) == DEFAULT:
        path = default_scenario(log)
    s = read_scenario(path, backend=backend, overrides=overrides)
    _check_names(scenario_path(path), s)
    return s


def _lm_eval_task_exists(task: str) -> bool:
    """lm-eval's task YAMLs, found without importing lm-eval (seconds): tasks/**/<task>.yaml or a
    folder of that name."""
    spec = importlib.util.find_spec("lm_eval")
    if spec is None or not spec.submodule_search_locations:
        return True  # no lm-eval here to check against: the accuracy step will say so
    tasks = Path(next(iter(spec.submodule_search_locations))) / "tasks"
    return (tasks / task).is_dir() or any(tasks.rglob(f"{task}.yaml"))


def _check_names(path: Path, s: Scenario) -> None:
    """Free-form names must name something that exists: a typo in a per-task limit ran gsm8k
    unlimited (1,319 questions per arm, hours on a CPU); a gated metric's typo failed the run late."""
    known = {m.key for m in metric_defs(s.workload.percentiles, s.workload.goodput is not None, energy=True)}
    for i, g in enumerate(s.gates.performance):
        if g.metric not in known:
            near = difflib.get_close_matches(g.metric, known, n=1)
            raise ScenarioError(
                f"{path}: gates.performance.{i}.metric: unknown metric {g.metric!r}"
                + (f" (did you mean {near[0]!r}?)" if near else "")
            )
    a = s.accuracy
    if not a.enabled:
        return
    for t in a.tasks:
        if t not in TASKS and not _lm_eval_task_exists(t):
            raise ScenarioError(
                f"{path}: accuracy.tasks: {t!r} is neither an lm-eval task nor one of the suite's ({', '.join(TASKS)})"
            )
    if isinstance(a.limit, dict) and (extra := sorted(set(a.limit) - set(a.tasks))):
        raise ScenarioError(f"{path}: accuracy.limit: {extra[0]!r} is not in accuracy.tasks ({', '.join(a.tasks)})")
    unlimited = [t for t in a.tasks if t not in TASKS and a.limit_for(t) is None]
    if s.server.device.value == "cpu" and unlimited:
        raise ScenarioError(
            f"{path}: accuracy: {unlimited[0]} has no limit and would run every question on a CPU "
            f"server (hours): set accuracy.limit, e.g. {{{unlimited[0]}: 16}}"
        )
