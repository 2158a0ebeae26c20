"""A scenario as a run needs it: read and validated (vse.scenario.load), then every free-form name
checked against what the suite knows: gated metrics against the metric registry, accuracy tasks
against the suite's own and lm-eval's. The scenario layer sits below the statistics and the checks,
so this last step lives here, where both are in reach."""

from __future__ import annotations

import difflib
import importlib.util
from collections.abc import Sequence
from pathlib import Path

from vse.errors import ScenarioError
from vse.paths import scenario_path
from vse.quality.small_tasks import TASKS
from vse.scenario import Scenario
from vse.scenario.load import read_scenario
from vse.stats.registry import metric_defs


def load_scenario(path: str | Path, *, backend: str | None = None, overrides: Sequence[str] = ()) -> Scenario:
    """The scenario at path with BACKEND and SET applied, validated, and its names checked."""
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
