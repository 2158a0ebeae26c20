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
import subprocess
import sys
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from vse.errors import SuiteError
from vse.exitcodes import ExitCode
from vse.orchestration.calibrate import server_minutes
from vse.orchestration.scenario_check import load_scenario
from vse.report import bisect as bisect_report
from vse.rundir.files import atomic_write_text, read_json, write_json
from vse.rundir.layout import BISECT_JSON, BISECT_MD, RunDir
from vse.scenario.builds import Builds, load_builds
from vse.stats.bisection import Search, Verdict, error_bound, more_than_one_change, verdict_of

# argv after `python -m vse.cli` -> its exit code; tests hand in their own
StepRunner = Callable[[list[str]], int]


def run_cli(args: list[str]) -> int:
    return subprocess.run([sys.executable, "-m", "vse.cli", *args]).returncode


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
    argv += ["--set", "arms.baseline=" + json.dumps(good.arm_settings(base))]
    argv += ["--set", "arms.candidate=" + json.dumps(builds.builds[i].arm_settings(base))]
    return argv + (["--base-run", base_run] if base_run else [])


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


def new_state(
    scenario: str, builds_path: str, sets: Sequence[str], root: Path, good: str | None, bad: str | None
) -> tuple[dict[str, Any], Builds]:
    s = load_scenario(scenario, overrides=sets)  # refused here, in seconds, before any step
    builds = load_builds(builds_path)
    g = builds.index(good) if good else 0
    b = builds.index(bad) if bad else len(builds.builds) - 1
    Search(len(builds.builds), g, b)  # the ends in order
    folder = root / f"{datetime.now(timezone.utc).strftime('%Y%m%dT%H%M%SZ')}-bisect-{s.name}"
    folder.mkdir(parents=True, exist_ok=False)
    state = {
        "folder": str(folder),
        "scenario": scenario,
        "sets": list(sets),
        "builds": [x.model_dump(mode="json", exclude_none=True) for x in builds.builds],
        "good": g,
        "bad": b,
        "bad_id": builds.builds[b].id,
        "baseline_arm": s.arms.baseline.model_dump(mode="json", exclude_none=True),
        "alpha": s.gates.significance,
        "steps": [],
        "pending": None,
        "status": "running",
        "answer": None,
    }
    return state, builds


def resume_state(folder: Path) -> tuple[dict[str, Any], Builds]:
    if not (folder / BISECT_JSON).is_file():
        raise SuiteError(f"{folder}: no {BISECT_JSON}: not a bisection folder")
    state = read_json(folder / BISECT_JSON)
    state["folder"] = str(folder)  # a folder copied elsewhere resumes where it is now
    return state, Builds.model_validate({"builds": state["builds"]})


def run_step(state: dict[str, Any], builds: Builds, i: int, runner: StepRunner, log: Callable[[str], None]) -> None:
    bid = builds.builds[i].id
    first = not state["steps"]
    base = None if first else state["steps"][0]["run"]
    pending = state.get("pending") or {}
    earlier = step_run_dir(state, bid) if pending.get("build") == bid else None
    state["pending"] = {"build": bid, "index": i}
    write(state)
    unfinished = earlier is not None and (lambda r: r.get("status") != "complete" or bool(r.get("stopped")))(
        read_json(RunDir(earlier).run_json)
    )
    if earlier is not None and unfinished:
        log(f"bisect: {bid}: resuming its comparison {earlier}")
        code = runner(["compare", "--resume", str(earlier)])
    else:
        log(f"bisect: {bid} ({'the bad end, checked first' if first else f'build {i} of 0..{len(builds.builds) - 1}'})")
        code = runner(step_args(state, builds, i, base))
    run_dir = step_run_dir(state, bid)
    v = verdict_of(code)
    state["steps"].append(
        {"build": bid, "index": i, "run": str(run_dir) if run_dir else None, "exit_code": code, "verdict": v.value}
        | evidence(run_dir, code)
    )
    state["pending"] = None
    log(f"bisect: {bid}: {ExitCode.describe(code)} -> {v.value}")
    write(state)


def run_bisect(state: dict[str, Any], builds: Builds, log: Callable[[str], None], runner: StepRunner = run_cli) -> int:
    """Steps until the answer is settled; bisect.json and bisect.md after each. Returns the exit code:
    0 a culprit named, 3 a range only (skips, or ends that do not differ), 2 the bad end's step failed."""
    n = len(builds.builds)
    if not state["steps"]:
        run_step(state, builds, state["bad"], runner, log)
    ends = state["steps"][0]
    if ends["verdict"] != Verdict.BAD.value:
        state["status"] = "done"
        state["answer"] = {"culprit": None, "ends": ends["verdict"]}
        write(state)
        log(
            f"bisect: the bad end {ends['build']} does not FAIL against the good end ({ends['verdict']}): nothing to bisect"
        )
        return ExitCode.RUN_FAILED if ends["exit_code"] == ExitCode.RUN_FAILED else ExitCode.INCONCLUSIVE
    while True:
        search = Search(n, state["good"], state["bad"], {s["index"]: Verdict(s["verdict"]) for s in state["steps"][1:]})
        nxt = search.next_points()
        if not nxt:
            break
        run_step(state, builds, nxt[0], runner, log)
    state["status"] = "done"
    state["answer"] = answer(state, builds, search, state["alpha"])
    write(state)
    return ExitCode.OK if state["answer"]["culprit"] else ExitCode.INCONCLUSIVE
