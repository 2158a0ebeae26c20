"""Whether another run's arm (BASE_RUN, CAND_RUN) is comparable with this scenario: the same
prompts, the same workload, the backend asked for. Checked before any server starts."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from vse.errors import SuiteError
from vse.loadgen.datasets import Prompt, load_prompts
from vse.rundir.files import read_json
from vse.rundir.layout import RunDir
from vse.rundir.state import REUSE_VAR, check_reuse_source
from vse.scenario import Scenario


def check_reusable(s: Scenario, arm: str, src_run: Path, prompts_for: Callable[[int], list[Prompt]]) -> None:
    """Refuses, before any server starts, another run's arm that would not be comparable."""
    run = RunDir(src_run)
    src = run.arm(arm)
    var = REUSE_VAR[arm]
    check_reuse_source(arm, src_run)
    ks = sorted(src.metas())
    if not ks or any(not run.prompts(k).is_file() or load_prompts(run.prompts(k)) != prompts_for(k) for k in ks):
        raise SuiteError(f"{var}={src_run}: its prompts differ from this scenario's; the arms would not be comparable")
    check_same_workload(s, var, src_run)
    want = getattr(s.arms, arm).backend.value
    got = {sv.get("requested_backend") for sv in read_json(src.servers)}
    if got != {want}:
        raise SuiteError(
            f"{var}={src_run}: its {arm} arm ran backend {', '.join(sorted(map(str, got)))}, "
            f"this scenario's {arm} is {want}"
        )


# What a run's numbers depend on besides its prompts (checked above): how they were sent and what
# the client asked the server for. Percentiles, timeouts and repeats only change what is reported.
MEASUREMENT_KEYS = (
    "endpoint",
    "num_prompts",
    "max_concurrency",
    "request_rate",
    "burstiness",
    "warmup_requests",
    "duration_s",
    "ignore_eos",
    "temperature",
    "client_processes",
    "usage_per_chunk",
    "stages",
)


def check_same_workload(s: Scenario, var: str, src_run: Path) -> None:
    """A reused arm was measured under this scenario's workload: one recorded without usage per
    chunk against a candidate measured per token, or at another concurrency, is no comparison."""
    import yaml

    try:
        theirs = (yaml.safe_load(RunDir(src_run).scenario.read_text()) or {}).get("workload") or {}
    except (OSError, yaml.YAMLError) as e:
        raise SuiteError(f"{var}={src_run}: its scenario.yaml cannot be read ({e}); nothing was started") from None
    ours = s.workload.model_dump(mode="json")
    default = type(s.workload)().model_dump(mode="json")  # a key an older run did not write had its default
    diff = [
        f"{k} {theirs.get(k, default[k])!r} there, {ours[k]!r} here"
        for k in MEASUREMENT_KEYS
        if theirs.get(k, default[k]) != ours[k]
    ]
    if diff:
        raise SuiteError(f"{var}={src_run}: its workload differs ({'; '.join(diff)}); the arms would not be comparable")
