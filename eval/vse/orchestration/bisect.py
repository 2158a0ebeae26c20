"""`vse bisect`: the first build of an ordered list that is worse than the known-good end by more
than the scenario's margins, found by comparisons the scenario's own gates decide.

Every step is an ordinary comparison run directory (`vse compare` in a process of its own, under
<bisect folder>/runs/<build id>/), the good end as its baseline and the build as its candidate, both
arms the scenario's baseline arm run by that build's vLLM. The first step checks the bad end (a
range whose ends do not differ is not bisected); later steps reuse the good end's server starts from
it (`--base-run`), adding starts where their sequential looks need more. FAIL is bad, PASS good,
anything else a skip (stats/bisection.py). bisect.json is written after every step and says which
step is under way, so a cancelled bisection resumes where it stopped (`--resume FOLDER`), its step
included (`vse compare --resume`)."""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

from vse.errors import SuiteError
from vse.exitcodes import ExitCode
from vse.models import provision
from vse.orchestration import child
from vse.orchestration.calibrate import server_minutes
from vse.orchestration.qualify import in_image
from vse.orchestration.scenario_check import load_scenario
from vse.report import bisect as bisect_report
from vse.rundir.files import atomic_write_text, new_folder, read_json, write_json
from vse.rundir.layout import BISECT_HTML, BISECT_JSON, BISECT_MD, RunDir
from vse.rundir.state import finished_exit_code
from vse.scenario.builds import Builds, load_builds
from vse.stats.bisection import Search, Verdict, error_bound, more_than_one_change, verdict_of

# argv after `python -m vse.cli` -> its exit code; tests hand in their own
StepRunner = Callable[[list[str]], int]


def step_args(state: dict[str, Any], builds: Builds, i: int, base_run: str | None) -> list[str]:
    """`vse compare` for build i against the good end."""
    base = state["baseline_arm"]
    good = builds.builds[state["good"]]
    argv = [
        "compare",
        "--scenario",
        state["scenario"],
        "--reports",
        str(Path(state["folder"]) / "runs" / builds.builds[i].id),
    ]
    argv += [a for x in state["sets"] for a in ("--set", x)]
    envs = envs_of(state)
    argv += ["--set", "arms.baseline=" + json.dumps(good.arm_settings(base, envs))]
    argv += ["--set", "arms.candidate=" + json.dumps(builds.builds[i].arm_settings(base, envs))]
    return argv + (["--base-run", base_run] if base_run else [])


def envs_of(state: dict[str, Any]) -> Path:
    """Where the wheel builds' environments are made: the bisection's folder (each agent its own copy)."""
    return Path(state["folder"]) / "envs"


def install_wheels(state: dict[str, Any], builds: Builds, indices: Sequence[int], log: Callable[[str], None]) -> None:
    """The wheel builds among these, each installed once into its environment over wheel_python's
    packages; a wheel that cannot be installed ends the bisection with the build named."""
    for i in indices:
        b = builds.builds[i]
        if b.wheel is not None and not provision.wheel_env_ready(b.env(envs_of(state))):
            log(f"bisect: {b.id}: installing {b.wheel}")
            provision.install_wheel_env(b.env(envs_of(state)), b.wheel, builds.wheel_python)


def step_run_dir(state: dict[str, Any], build_id: str) -> Path | None:
    runs = sorted(p for p in (Path(state["folder"]) / "runs" / build_id).glob("*") if RunDir(p).run_json.is_file())
    return runs[-1] if runs else None


def evidence(run_dir: Path | None, code: int) -> dict[str, Any]:
    """What a step's run decided, from its results.json: each gate, the interval of each gated metric."""
    if run_dir is None or not RunDir(run_dir).results.is_file():
        return {"gates": [], "changes": {}, "server_minutes": 0.0, "note": f"no results (exit {code})"}
    res = read_json(RunDir(run_dir).results)
    gated = {g.get("metric") for g in res.get("gates", []) if g.get("metric")}
    changes = {
        r["key"]: {k: r.get(k) for k in ("rel_change", "ci_low", "ci_high", "higher_is_better")}
        for r in res.get("comparison", [])
        if r.get("key") in gated
    }
    gates = [{k: g.get(k) for k in ("name", "outcome", "detail", "metric")} for g in res.get("gates", [])]
    run = read_json(RunDir(run_dir).run_json)
    return {"gates": gates, "changes": changes, "server_minutes": round(server_minutes(run), 1)}


def answer(state: dict[str, Any], builds: Builds, search: Search, alpha: float) -> dict[str, Any]:
    lo, hi = search.bounds()
    decided = [s for s in state["steps"] if s["verdict"] != Verdict.SKIP.value]
    culprit = search.culprit()
    out: dict[str, Any] = {
        "culprit": builds.builds[culprit].id if culprit is not None else None,
        "last_good": builds.builds[lo].id,
        "first_bad": builds.builds[hi].id,
        "skipped": [builds.builds[i].id for i in search.skipped_between()],
        "decided_steps": len(decided),
        "p_wrong_at_most": error_bound([alpha] * len(decided)),
        "more_than_one_change": [],
    }
    if culprit is not None:
        out["more_than_one_change"] = _also_changed(state, builds.builds[culprit].id)
    return out


def _also_changed(state: dict[str, Any], culprit_id: str) -> list[str]:
    """Gated metrics on which the bad end is worse than the culprit alone explains (95% intervals)."""
    steps = {s["build"]: s for s in state["steps"]}
    c, b = steps.get(culprit_id), steps.get(state["bad_id"])
    if c is None or b is None or c is b:
        return []
    out = []
    for key, bc in b["changes"].items():
        cc = c["changes"].get(key)
        if cc and None not in (cc["ci_low"], cc["ci_high"], bc["ci_low"], bc["ci_high"]):
            worse_up = not bc["higher_is_better"]
            if more_than_one_change((cc["ci_low"], cc["ci_high"]), (bc["ci_low"], bc["ci_high"]), worse_up):
                out.append(key)
    return out


def write(state: dict[str, Any]) -> None:
    folder = Path(state["folder"])
    write_json(folder / BISECT_JSON, state)
    atomic_write_text(folder / BISECT_MD, bisect_report.markdown(state))
    atomic_write_text(folder / BISECT_HTML, bisect_report.html(state))


def new_state(
    scenario: str,
    builds_path: str,
    sets: Sequence[str],
    root: Path,
    good: str | None,
    bad: str | None,
    arm: str = "baseline",
    backend: str | None = None,
) -> tuple[dict[str, Any], Builds]:
    """A bisection's plan on disk. Both sides of every step run the scenario's `arm` (its baseline by
    default; the regressed series' arm from a trend), each with its build's vLLM."""
    s = load_scenario(scenario, backend=backend, overrides=sets)  # refused here, in seconds, before any step
    builds = load_builds(builds_path)
    g = builds.index(good) if good else 0
    b = builds.index(bad) if bad else len(builds.builds) - 1
    Search(len(builds.builds), g, b)  # the ends in order
    folder = new_folder(root, f"bisect-{s.name}")
    state = {
        "folder": str(folder),
        "scenario": scenario,
        "sets": list(sets),
        "builds": [x.model_dump(mode="json", exclude_none=True) for x in builds.builds],
        "wheel_python": builds.wheel_python,
        "good": g,
        "bad": b,
        "bad_id": builds.builds[b].id,
        "arm": arm,
        "baseline_arm": getattr(s.arms, arm).model_dump(mode="json", exclude_none=True),
        "alpha": s.gates.significance,
        "steps": [],
        "pending": None,
        "status": "running",
        "answer": None,
    }
    write(state)  # the plan is on disk before any step: a fleet's agents read it, a cancel resumes it
    return state, builds


# -- from the nightly's trend: the regression's two nights, the vLLM commits between them --------------


def commit_of(vllm: str | None) -> str | None:
    """The git revision a night's vLLM version names: a dev build's commit (0.26.1.dev19+g3f2a9c1),
    a release's tag (0.26.0 -> v0.26.0); None where the night recorded no version."""
    if m := re.search(r"\+g([0-9a-f]{7,40})\b", vllm or ""):
        return m[1]
    if m := re.match(r"(\d+\.\d+\.\d+)$", vllm or ""):
        return f"v{m[1]}"
    return None


def _git(repo: Path, *args: str) -> str:
    r = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
    if r.returncode != 0:
        why = (r.stderr.strip().splitlines() or [f"exit {r.returncode}"])[-1]
        raise SuiteError(f"git {' '.join(args)} in {repo}: {why}")
    return r.stdout.strip()


def builds_between(repo: Path, good: str, bad: str, template: str) -> dict[str, Any]:
    """builds.yaml's content for the commits of a vLLM clone from `good` (the known-good end) to `bad`,
    oldest first (`git rev-list --ancestry-path`: the commits that lead from one to the other), each a
    wheel made from the template and its full commit id."""
    ends = [_git(repo, "rev-parse", "--verify", f"{rev}^{{commit}}") for rev in (good, bad)]
    between = _git(repo, "rev-list", "--reverse", "--ancestry-path", f"{ends[0]}..{ends[1]}").split()
    if not between:
        raise SuiteError(f"{bad} does not come after {good} in {repo}: no commits to bisect")
    return {"wheel_template": template, "builds": [{"id": c} for c in [ends[0], *between]]}


def from_trend(
    trend_json: Path,
    series: int,
    repo: Path,
    template: str,
    sets: Sequence[str],
    root: Path,
    log: Callable[[str], None],
) -> tuple[dict[str, Any], Builds] | None:
    """A bisection of the trend's open regression number `series` (1-based) over the vLLM commits
    between its last good and first bad nights (wheels from the template); None where the trend has
    no open regression."""
    if not trend_json.is_file():
        raise SuiteError(f"--from-trend {trend_json}: not found (vse trend writes it beside trend.md)")
    regressions = read_json(trend_json).get("open_regressions", [])
    if not regressions:
        log(f"bisect: {trend_json} holds no open regression: nothing to bisect")
        return None
    if not 1 <= series <= len(regressions):
        raise SuiteError(f"--series {series}: {trend_json} holds {len(regressions)} open regression(s)")
    r = regressions[series - 1]
    scenario = Path("scenarios") / f"{r['scenario']}.yaml"
    if not scenario.is_file():
        raise SuiteError(f"{trend_json}: the regressed series' scenario {r['scenario']} is not {scenario}")
    revs = []
    for end in ("last_good", "first_bad"):
        if (rev := commit_of(r[end]["vllm"])) is None:
            raise SuiteError(
                f"{trend_json}: night {r[end]['run']} recorded vLLM {r[end]['vllm']!r}, which names no commit or release"
            )
        revs.append(rev)
    log(f"bisect: {r['series']}, {r['metric']} {r['change_pct']:+.2f}%: vLLM {revs[0]} (good) to {revs[1]} (bad)")
    spec = builds_between(repo, revs[0], revs[1], template)
    root.mkdir(parents=True, exist_ok=True)
    path = new_folder(root, f"builds-{r['scenario']}") / "builds.yaml"
    atomic_write_text(path, yaml.safe_dump(spec, sort_keys=False))
    log(f"bisect: {len(spec['builds'])} builds ({path})")
    backend = r["backend"] if r["arm"] == "candidate" else None  # the baseline arm keeps the scenario's
    return new_state(str(scenario), str(path), sets, root, None, None, arm=r["arm"], backend=backend)


def resume_state(folder: Path) -> tuple[dict[str, Any], Builds]:
    if not (folder / BISECT_JSON).is_file():
        raise SuiteError(f"{folder}: no {BISECT_JSON}: not a bisection folder")
    state = read_json(folder / BISECT_JSON)
    state["folder"] = str(folder)  # a folder copied elsewhere resumes where it is now
    return state, Builds.model_validate(
        {"builds": state["builds"], "wheel_python": state.get("wheel_python", "python3")}
    )


class BudgetSpent(Exception):
    """The call's time budget ended a step's comparison before its plan did: the step stays under way."""


def _budget(deadline: float | None) -> list[str]:
    """A step's share of the call's time budget: what is left of it (vse compare's --budget)."""
    return [] if deadline is None else ["--budget", f"{max(deadline - time.monotonic(), 1):.0f}"]


def measure(
    state: dict[str, Any],
    builds: Builds,
    i: int,
    runner: StepRunner,
    log: Callable[[str], None],
    deadline: float | None = None,
) -> dict:
    """Build i's comparison against the good end (its unfinished one resumed), as a step record;
    BudgetSpent where the time budget stopped it first."""
    bid = builds.builds[i].id
    earlier = step_run_dir(state, bid)
    ended = finished_exit_code(earlier) if earlier is not None else None
    if ended is not None:
        log(f"bisect: {bid}: its comparison {earlier} ended before the bisection recorded it: taken as it is")
        code = ended
    elif earlier is not None:
        install_wheels(state, builds, [state["good"], i], log)
        log(f"bisect: {bid}: resuming its comparison {earlier}")
        code = runner(["compare", "--resume", str(earlier), *_budget(deadline)])
    else:
        first = i == state["bad"] and not state["steps"]
        install_wheels(state, builds, [state["good"], i], log)
        log(f"bisect: {bid} ({'the bad end, checked first' if first else f'build {i} of 0..{len(builds.builds) - 1}'})")
        code = runner(step_args(state, builds, i, None if first else state["steps"][0]["run"]) + _budget(deadline))
    run_dir = step_run_dir(state, bid)
    if run_dir is not None and finished_exit_code(run_dir) is None and code != ExitCode.RUN_FAILED:
        raise BudgetSpent(f"{bid}'s comparison {run_dir} stopped on the time budget")
    v = verdict_of(code)
    log(f"bisect: {bid}: {ExitCode.describe(code)} -> {v.value}")
    return {
        "build": bid,
        "index": i,
        "run": str(run_dir) if run_dir else None,
        "exit_code": code,
        "verdict": v.value,
    } | evidence(run_dir, code)


def run_step(
    state: dict[str, Any],
    builds: Builds,
    i: int,
    runner: StepRunner,
    log: Callable[[str], None],
    deadline: float | None = None,
) -> None:
    """One step on this machine: named as under way in bisect.json, measured, recorded."""
    state["pending"] = {"build": builds.builds[i].id, "index": i}
    write(state)
    try:
        step = measure(state, builds, i, runner, log, deadline)
    except KeyboardInterrupt:  # bisect.json names the step under way; its comparison marked itself interrupted
        log(
            f"bisect: cancelled during {builds.builds[i].id}'s step; "
            f"`vse bisect --resume {state['folder']}` goes on from it"
        )
        raise
    state["steps"].append(step)
    state["pending"] = None
    write(state)


def next_round(state: dict[str, Any], builds: Builds, k: int = 1) -> list[int]:
    """The builds the next round tests (k agents): the bad end alone first; none once settled."""
    if not state["steps"]:
        return [state["bad"]]
    if state["steps"][0]["verdict"] != Verdict.BAD.value:
        return []
    return search_of(state, builds).next_points(k)


def search_of(state: dict[str, Any], builds: Builds) -> Search:
    steps = state["steps"][1:]
    return Search(len(builds.builds), state["good"], state["bad"], {s["index"]: Verdict(s["verdict"]) for s in steps})


def finish(state: dict[str, Any], builds: Builds, log: Callable[[str], None]) -> int:
    """The answer, once no step is left: 0 a culprit named, 3 a range only (skips, or ends that do
    not differ), 2 the bad end's own comparison failed to run."""
    ends = state["steps"][0]
    state["status"] = "done"
    if ends["verdict"] != Verdict.BAD.value:
        state["answer"] = {"culprit": None, "ends": ends["verdict"]}
        log(
            f"bisect: the bad end {ends['build']} does not FAIL against the good end ({ends['verdict']}): nothing to bisect"
        )
        code = ExitCode.RUN_FAILED if ends["exit_code"] == ExitCode.RUN_FAILED else ExitCode.INCONCLUSIVE
    else:
        state["answer"] = answer(state, builds, search_of(state, builds), state["alpha"])
        code = ExitCode.OK if state["answer"]["culprit"] else ExitCode.INCONCLUSIVE
    write(state)
    return code


def run_bisect(
    state: dict[str, Any],
    builds: Builds,
    log: Callable[[str], None],
    runner: StepRunner = child.run,
    budget_s: float | None = None,
) -> int:
    """On one machine: a step at a time until the answer is settled; bisect.json and bisect.md after
    each. With a time budget (seconds), each step's comparison gets what is left of it, and a step
    it stops stays under way: `--resume` goes on from it (INCONCLUSIVE meanwhile)."""
    deadline = None if budget_s is None else time.monotonic() + budget_s
    while pts := next_round(state, builds):
        try:
            run_step(state, builds, pts[0], runner, log, deadline)
        except BudgetSpent as e:
            log(f"bisect: {e}; `vse bisect --resume {state['folder']}` goes on from it")
            return ExitCode.INCONCLUSIVE
    return finish(state, builds, log)


# -- on a fleet: a round's steps on k agents at once, a Buildkite dynamic pipeline per round -----------


def step_file(state: dict[str, Any], build_id: str) -> Path:
    """Where an agent's step leaves its record (one file per step: agents never share bisect.json)."""
    return Path(state["folder"]) / "steps" / f"{build_id}.json"


def run_only(
    state: dict[str, Any], builds: Builds, build_id: str, log: Callable[[str], None], runner: StepRunner = child.run
) -> int:
    """One step of a round, on its agent: its comparison, its record in steps/<build id>.json."""
    rec = measure(state, builds, builds.index(build_id), runner, log)
    write_json(step_file(state, build_id), rec)
    return rec["exit_code"]


def collect(state: dict[str, Any], builds: Builds) -> None:
    """A round's step records (its agents' artifacts) into bisect.json, in build order."""
    have = {s["build"] for s in state["steps"]}
    new = [read_json(f) for f in sorted((Path(state["folder"]) / "steps").glob("*.json"))]
    new = sorted((r for r in new if r["build"] not in have), key=lambda r: r["index"])
    if not state["steps"]:  # the bad end's round: its record comes first, the good end's starts are its
        new = [r for r in new if r["index"] == state["bad"]]
    state["steps"] += new
    write(state)


def pipeline(state: dict[str, Any], builds: Builds, points: list[int], agents: int, queue: str) -> dict:
    """A round as a Buildkite dynamic pipeline: one step per build on the GPU queue (the bisection's
    folder and the bad end's run as artifacts in, its step record and run directory out), then a
    step that collects the round and uploads the next one (or annotates the answer)."""
    f = state["folder"]
    bad = builds.builds[state["bad"]].id
    steps: list[dict] = [
        {
            "label": f":mag: bisect {builds.builds[i].id}",
            "key": f"bisect-{builds.builds[i].id}",
            "command": (
                f'buildkite-agent artifact download "{f}/bisect.json" .\n'
                f'buildkite-agent artifact download "{f}/runs/{bad}/**/*" . || echo "the bad end is this step"\n'
                f"bin/ci-step bisect-{builds.builds[i].id} --run-in {f}/runs/{builds.builds[i].id} -- "
                f"bin/vse bisect --resume {f} --only {builds.builds[i].id}"
            ),
            "artifact_paths": [f"{f}/steps/{builds.builds[i].id}.json", f"{f}/runs/{builds.builds[i].id}/**/*"],
            "plugins": in_image(gpus=True),
            "agents": {"queue": queue},
            "soft_fail": [
                {"exit_status": 1},
                {"exit_status": 3},
                {"exit_status": 4},
            ],  # a step's verdict, not a failure
        }
        for i in points
    ]
    steps.append({"wait": None, "continue_on_failure": True})
    steps.append(
        {
            "label": ":mag: bisect: collect the round",
            "key": f"bisect-collect-{len(state['steps'])}",
            "command": (
                f'buildkite-agent artifact download "{f}/**/*" .\n'
                # ci-step merges stderr into stdout: the pipeline goes to a file inside its command, and
                # is uploaded there (the answer, once settled, is the annotation: bisect.md)
                f"bin/ci-step bisect --report {f}/{BISECT_MD} -- bash -c '"
                f"bin/vse bisect --resume {f} --collect --agents {agents} --queue {queue} --emit-pipeline > {f}/next.yml; "
                f"code=$$?; if [ -s {f}/next.yml ]; then buildkite-agent pipeline upload {f}/next.yml || code=2; fi; "
                "exit $$code'"
            ),
            "artifact_paths": [f"{f}/bisect.*"],
            "plugins": in_image(gpus=False),
            "agents": {"queue": "cpu"},
            "soft_fail": [{"exit_status": 3}],
        }
    )
    return {"steps": steps}
