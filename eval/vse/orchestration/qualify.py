"""make qualify SUITE=...: a named list of comparisons (scenarios/suites/<name>.yaml), each run as
`make compare` runs it (a process of its own, so one crash cannot take the others with it), then
one index report linking every run with its verdicts. Exit code: the worst outcome, a crashed run
(2) over FAIL (1) over INCONCLUSIVE (3) over PASS (0), where a performance FAIL counts only if it
stands across the release's performance gates together (demote_unsupported_fails). An entry that was refused here (4), skipped
(its step's condition, e.g. no Blackwell queue) or lost (no result) qualified nothing: it makes the
suite INCONCLUSIVE unless the suite marks it `optional`, and the index lists it either way."""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from vse import exitcodes
from vse.backends import Backend
from vse.errors import SuiteError, UnsupportedError
from vse.exitcodes import ExitCode
from vse.orchestration import child
from vse.orchestration.scenario_check import load_scenario
from vse.paths import suites_dir
from vse.rundir.files import write_json
from vse.rundir.layout import QUALIFY_JSON, QUALIFY_MD, REPORTS, RunDir, qualify_entry
from vse.rundir.state import finished_exit_code
from vse.scenario import GateFamily
from vse.server import preflight
from vse.stats.decide import standing_fails

OUTCOME: dict[int, str] = {
    ExitCode.OK: "PASS",
    ExitCode.GATE_FAILED: "FAIL",
    ExitCode.RUN_FAILED: "RUN FAILED",
    ExitCode.INCONCLUSIVE: "INCONCLUSIVE",
    ExitCode.UNSUPPORTED: "UNSUPPORTED (refused here: not qualified)",
    ExitCode.BUSY: "BUSY (another comparison held the devices: not qualified)",
}
NOT_RUN = "NOT RUN (no result: not qualified)"
OPTIONAL = " (optional: listed, not counted)"


class Entry(BaseModel):
    model_config = ConfigDict(extra="forbid")
    scenario: str
    backend: Backend | None = None
    set: list[str] = []
    # True: a refusal, a skip or a lost step of this entry leaves the suite's outcome alone
    # (its index still lists it); a FAIL or a crash counts whatever this says.
    optional: bool = False


class Suite(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    description: str = ""
    set: list[str] = []  # applied to every run (e.g. the candidate vLLM's Python)
    runs: list[Entry]


def load_suite(name_or_path: str, root: Path | None = None) -> Suite:
    root = root or suites_dir()
    path = Path(name_or_path)
    if not path.is_file():
        path = root / f"{name_or_path}.yaml"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in root.glob("*.yaml")))
        raise SuiteError(f"SUITE={name_or_path}: no such suite (known: {known})")
    try:
        # ${VAR} stays as written: each run's scenario expands it and names a missing one.
        return Suite.model_validate(yaml.safe_load(path.read_text()))
    except (ValidationError, yaml.YAMLError, ValueError) as e:
        raise SuiteError(f"{path}: {str(e).splitlines()[0]}") from None


def check_entries(suite: Suite, reports: Path | None = None) -> None:
    """Every entry read, validated and (with `reports`: on the machine that will run them) put
    through compare's preflight, in seconds, before any of them runs: a typo in the last entry must
    not cost the device time of those before it. A configuration this machine cannot run (exit 4)
    is no broken entry: it is listed as refused when its turn comes. For a pipeline (reports None)
    the variables its steps set themselves (the candidate's Python) stand in as placeholders."""
    for i, e in enumerate(suite.runs, 1):
        try:
            with _placeholders([*suite.set, *e.set]) if reports is None else nullcontext():
                s = load_scenario(
                    e.scenario, backend=e.backend.value if e.backend else None, overrides=[*suite.set, *e.set]
                )
            if reports is not None:
                preflight.before_a_comparison(s, reports)
        except UnsupportedError:
            continue
        except SuiteError as err:
            raise SuiteError(f"suite {suite.name}: entry {i} ({e.scenario}): {err}; nothing was run") from None


@contextmanager
def _placeholders(sets: list[str]) -> Iterator[None]:
    """${VAR}s of the suite's overrides that the environment lacks, set for the block to a path no
    file is at (a pipeline's step sets them; the entries are checked where they are emitted)."""
    missing = {m for s in sets for m in re.findall(r"\$\{(\w+)\}", s) if m not in os.environ}
    os.environ.update({m: f"/set-by-the-step/{m}" for m in missing})
    try:
        yield
    finally:
        for m in missing:
            os.environ.pop(m, None)


def counted(code: int | None, optional: bool) -> int:
    """What one entry's outcome (None: it left no result) makes of the suite's: an entry that was
    refused, skipped or lost qualified nothing, so a required one is INCONCLUSIVE and an optional
    one does not count."""
    if code is None or code in (ExitCode.UNSUPPORTED, ExitCode.BUSY):
        return ExitCode.OK if optional else ExitCode.INCONCLUSIVE
    return code


def worst(results: list[tuple[int | None, bool]]) -> int:
    """The suite's exit code from its entries' (exit code or None, optional)."""
    return exitcodes.worst([counted(c, opt) for c, opt in results])


# Console lines worth a line in a CI log while a comparison runs for hours: server starts, runs, stops.
PROGRESS = ("healthy after", ": repeat ", "stopping:", "error:", "planted-slowdown: applied")


def run_entry(suite: Suite, i: int, out: Path, log=print, budget_s: float | None = None) -> dict:
    """One entry of the list as a `vse compare` of its own; its console goes to run-N.log, and a
    line per server start and run to `log` (a Buildkite log is not silent for hours). The result
    is kept as entry-N.json, which `aggregate` folds into the index. An entry whose comparison a
    time budget or a cancel stopped is resumed where it stopped (the same --out again, as a GPU
    lent for ten minutes at a time needs); one that finished is taken as it is."""
    e = suite.runs[i]
    runs_root = out / "runs"
    runs_root.mkdir(parents=True, exist_ok=True)
    path = qualify_entry(out, i + 1)
    prior = _read_result(path)
    earlier = out / prior["run"] if prior and prior.get("run") and (out / prior["run"] / "run.json").is_file() else None
    if earlier is not None and finished_exit_code(earlier) is not None:
        log(f"qualify {suite.name}: run {i + 1} of {len(suite.runs)}: {earlier} is finished: taken as it is")
        done = _result(e, finished_exit_code(earlier), earlier, prior.get("message", ""), out)  # type: ignore[union-attr]
        write_json(path, done)
        return done
    before = set(runs_root.iterdir())
    if earlier is not None:
        argv = ["compare", "--resume", str(earlier)]
    else:
        argv = ["compare", "--scenario", e.scenario, "--reports", str(runs_root)]
        argv += ["--backend", e.backend.value] if e.backend else []
        for s in [*suite.set, *e.set]:
            argv += ["--set", s]
    argv += ["--budget", f"{budget_s:g}"] if budget_s else []
    log(
        f"qualify {suite.name}: run {i + 1} of {len(suite.runs)}: {e.scenario}"
        + (f" BACKEND={e.backend.value}" if e.backend else "")
        + (f", resuming {earlier}" if earlier is not None else "")
        + f" (console: {out}/run-{i + 1}.log)"
    )
    log_path = out / f"run-{i + 1}.log"  # its console, to follow with tail -f
    code: int | None = None
    try:
        with (
            open(log_path, "a" if earlier is not None else "w") as f,
            child.running(
                child.argv(argv),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                env={**os.environ, "COLUMNS": "200"},
            ) as proc,
        ):
            assert proc.stdout is not None
            for line in proc.stdout:
                f.write(line)
                if any(p in line for p in PROGRESS):
                    log(f"  run {i + 1}: {line.strip().lstrip('> ')}")
        code = proc.returncode
    finally:  # a cancel too leaves the entry's run named, so the next call resumes it
        new = sorted(p for p in set(runs_root.iterdir()) - before if p.is_dir())
        run_dir = earlier or (new[-1] if new else None)
        lines = log_path.read_text().strip().splitlines() if log_path.is_file() else []
        last = next((ln for ln in reversed(lines) if ln.startswith("error:")), lines[-1] if lines else "")
        r = _result(e, code, run_dir, last, out)
        write_json(path, r)
    if r.get("stopped"):
        log(f"  -> stopped: {r['stopped']} (the same command again resumes it)")
    else:
        log(
            f"  -> {OUTCOME.get(code, code)}"  # type: ignore[arg-type]
            + (f" ({last})" if code in (ExitCode.RUN_FAILED, ExitCode.UNSUPPORTED) else "")
        )
    return r


def run_suite(suite: Suite, out: Path, log=print, budget_s: float | None = None) -> int:
    """Every entry in turn (a finished one is taken as it is). With a time budget, an entry that
    stops on it ends the call: the same command again goes on from there."""
    for i in range(len(suite.runs)):
        if run_entry(suite, i, out, log, budget_s).get("stopped"):
            break
    return aggregate(suite, out)


def aggregate(suite: Suite, out: Path) -> int:
    """index.json / index.md and the exit code from the entries' results (entry-N.json); an entry
    with no result (its step was skipped, never ran or was lost) is listed as not run."""
    results = []
    for i, e in enumerate(suite.runs):
        path = qualify_entry(out, i + 1)
        r = _read_result(path) or _result(
            e, None, None, f"entry {i + 1} left no result ({path.name}): skipped by its step's condition or lost", out
        )
        r["optional"] = e.optional
        results.append(r)
    demote_unsupported_fails(results)  # a FAIL the release's other tests do not let stand reads INCONCLUSIVE
    for r in results:
        r["counted"] = counted(r["release_exit_code"], r["optional"])
    code = worst([(r["release_exit_code"], r["optional"]) for r in results])
    index = {
        "suite": suite.name,
        "description": suite.description,
        "finished": datetime.now(timezone.utc).isoformat(),
        "exit_code": code,
        "outcome": OUTCOME[code],
        "runs": results,
    }
    write_json(out / QUALIFY_JSON, index)
    (out / QUALIFY_MD).write_text(markdown(index))
    return code


# The gate families whose FAILs carry a p-value and are controlled together across a release:
# performance gates, accuracy keys (each key a test, Tango's score test at the margin; gsm8k's two
# keys in the same family as every other test) and fidelity (the t test its ratio interval inverts).
# Agreement is a threshold with no level: its FAILs stand as their runs decided them.
RELEASE_FAMILIES = (GateFamily.PERFORMANCE.value, GateFamily.ACCURACY.value, GateFamily.FIDELITY.value)


def demote_unsupported_fails(results: list[dict]) -> None:
    """Release-level error control on the FAIL side (stats.decide.standing_fails): every
    performance gate and every paired accuracy key of every entry is one test in one family. Each
    entry gets release_exit_code: its own exit code, or INCONCLUSIVE with a note when none of its
    FAILs stands across the release. Its own run keeps its verdict; PASS and the other gates are
    untouched."""
    for r in results:
        r["release_exit_code"] = r["exit_code"]
    tests = [
        (i, g)
        for i, r in enumerate(results)
        if r.get("gate_alpha")
        for g in r.get("gates", [])
        if g.get("family") in RELEASE_FAMILIES and g.get("p_fail") is not None
    ]
    stands = standing_fails([(g["p_fail"], results[i]["gate_alpha"]) for i, g in tests])
    for (_, g), ok in zip(tests, stands):
        g["release_stands"] = ok
    for r in results:
        fails = [g for g in r.get("gates", []) if g.get("outcome") == "fail"]
        if r["exit_code"] == ExitCode.GATE_FAILED and fails and all(g.get("release_stands") is False for g in fails):
            r["release_exit_code"] = ExitCode.INCONCLUSIVE
            r["release_note"] = (
                f"its FAIL does not stand across the release's {len(tests)} performance, accuracy and fidelity tests "
                "(Holm over every entry's gates): INCONCLUSIVE here, FAIL in its own report"
            )


def _read_result(path: Path) -> dict | None:
    """An entry's result file, or None where it is missing or unreadable (a step cut off mid-write)."""
    try:
        r = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return r if isinstance(r, dict) and "exit_code" in r else None


def _result(e: Entry, code: int | None, run_dir: Path | None, last_line: str, out: Path) -> dict:
    r: dict[str, Any] = {
        "scenario": e.scenario,
        "backend": e.backend.value if e.backend else None,
        "set": e.set,
        "exit_code": code,
        "outcome": NOT_RUN if code is None else OUTCOME.get(code, str(code)),
        "run": str(run_dir.relative_to(out)) if run_dir else None,
        "message": last_line if code in (None, ExitCode.RUN_FAILED, ExitCode.UNSUPPORTED) else "",
        "headline": "",
        "gates": [],
    }
    res = RunDir(run_dir).results if run_dir else None
    if run_dir and res and res.is_file():
        data = json.loads(res.read_text())
        r["gates"] = [{k: g.get(k) for k in ("name", "outcome", "family", "p_fail")} for g in data.get("gates", [])]
        r["gate_alpha"] = (data.get("design") or {}).get("gate_alpha")
        summary = RunDir(run_dir).summary
        if summary.is_file():
            r["headline"] = summary.read_text().splitlines()[2]
    if run_dir and RunDir(run_dir).run_json.is_file():
        run = json.loads(RunDir(run_dir).run_json.read_text())
        if run.get("stopped") or run.get("status") in ("interrupted", "running"):
            r["stopped"] = run.get("stopped") or f"the comparison was {run.get('status')}"
            r["outcome"] = f"STOPPED ({r['stopped']}): not qualified yet"
            r["exit_code"] = None  # qualified nothing yet: the same command resumes it
    return r


def markdown(index: dict) -> str:
    L = [
        f"# Qualification: {index['suite']}",
        "",
        f"**{index['outcome']}** (exit {index['exit_code']}). {index['description']}",
        "",
        "| # | Scenario | Backend | Outcome | Run | Verdict |",
        "|---:|---|---|---|---|---|",
    ]
    for i, r in enumerate(index["runs"], 1):
        link = f"[{Path(r['run']).name}]({r['run']}/summary.md)" if r["run"] else "none"
        outcome = r["outcome"] + (
            OPTIONAL if r.get("optional") and r.get("counted") == ExitCode.OK != r["exit_code"] else ""
        )
        if r.get("release_note"):
            outcome += f" ({r['release_note']})"
        L.append(
            f"| {i} | {r['scenario']} | {r['backend'] or 'scenario'} | {outcome} | {link} | "
            f"{r['headline'] or r['message']} |"
        )
    return "\n".join(L + [""])


def in_image(*, gpus: bool, env: tuple[str, ...] = ()) -> list[dict]:
    """The docker plugin that runs a step in the suite's image for this commit ($VSE_IMAGE, built by
    the pipeline's image step), as the nightly's steps run: nothing is installed or fetched on the
    agent, and ci-step annotates from inside (the agent is mounted)."""
    return [
        {
            "docker#v5.12.0": {
                "image": "$VSE_IMAGE",
                "always-pull": True,
                **({"gpus": "all", "shm-size": "16gb"} if gpus else {}),
                "propagate-uid-gid": True,
                "mount-buildkite-agent": True,
                "environment": [
                    "NCCL_NVLS_ENABLE",
                    "TORCH_SYMM_MEM_DISABLE_MULTICAST",
                    "NVSHMEM_DISABLE_NVLS",
                    "BUILDKITE_BUILD_URL",
                    "BUILDKITE_JOB_ID",
                    "VSE_LOCK_DIR",  # the device lock, in the host's cache volume: shared by every job's container
                    "VSE_WAIT_LOCK",  # how long a comparison waits for devices another job holds
                    *env,
                ],
                "volumes": ["./reports:/suite/reports", "/var/cache/vllm-serving-eval:/var/cache/vllm-serving-eval"],
                "workdir": "/suite",
            }
        }
    ]


def pipeline(suite: Suite, queue: str = "gpu-h200", reports: str = f"{REPORTS}/qualify") -> dict:
    """A Buildkite dynamic pipeline (`bin/vse qualify --suite S --emit-pipeline | buildkite-agent
    pipeline upload`): one step per entry, in parallel on the GPU queue, each keeping its run
    directory and result as artifacts; then one step that aggregates them into the index and the
    suite's exit code (INCONCLUSIVE soft, as in the serial run). Entries for FlashInfer go to the
    Blackwell queue and have no step where there is none: the index lists them as not run."""
    steps: list[dict] = [
        {
            "label": f":white_check_mark: {suite.name} {i + 1}/{len(suite.runs)}: {Path(e.scenario).stem}"
            + (f" ({e.backend.value})" if e.backend else ""),
            "key": f"qualify-{i + 1}",
            # the candidate from a wheel the build names, in an environment of this job's own (a
            # build's entries run side by side on one host: a folder per build was removed under
            # the next entry), removed when the step ends; the wheel alone is installed over the
            # image's packages, from the file, so nothing is fetched at run time
            "command": (
                'if [ -n "$${CANDIDATE_VLLM_WHEEL:-}" ]; then '
                'd=$$(mktemp -d "$${TMPDIR:-/tmp}/vllm-candidate-$${BUILDKITE_JOB_ID:-job}.XXXXXX"); '
                'trap \'rm -rf "$$d"\' EXIT; python3 -m venv --system-site-packages "$$d" && "$$d/bin/pip" install -q '
                '--no-index --no-deps "$$CANDIDATE_VLLM_WHEEL"; export CANDIDATE_VLLM_PYTHON=$$d/bin/python; fi\n'
                f"bin/ci-step {suite.name}-{i + 1} --run-in {reports}/runs -- "
                f"bin/vse qualify --suite {suite.name} --entry {i + 1} --out {reports}"
            ),
            "artifact_paths": [f"{reports}/**/*"],
            "plugins": in_image(gpus=True, env=("CANDIDATE_VLLM_WHEEL", "CANDIDATE_VLLM_PYTHON")),
            # FlashInfer's per-tensor FP8 GEMM needs SM100: its entries go to a Blackwell queue and are
            # skipped (not failed) where the organisation has none.
            "agents": {"queue": "${VSE_BLACKWELL_QUEUE:-gpu-b200}" if e.backend == Backend.FLASHINFER else queue},
            **({"if": 'build.env("VSE_BLACKWELL_QUEUE") != null'} if e.backend == Backend.FLASHINFER else {}),
            "soft_fail": [{"exit_status": 3}, {"exit_status": 4}],
            # -1: the agent was lost; 5: the devices stayed busy (exitcodes.RETRY_IN_CI)
            "retry": {"automatic": [{"exit_status": -1, "limit": 2}, {"exit_status": 5, "limit": 2}]},
            "timeout_in_minutes": 180,
        }
        for i, e in enumerate(suite.runs)
    ]
    steps.append({"wait": None, "continue_on_failure": True})
    steps.append(
        {
            "label": f":clipboard: {suite.name}: index and verdict",
            "key": "qualify-index",
            "command": (
                f'buildkite-agent artifact download "{reports}/**/*" . || echo "no entry uploaded a result"\n'
                f"bin/ci-step {suite.name} --report {reports}/{QUALIFY_MD} -- "
                f"bin/vse qualify --suite {suite.name} --aggregate --out {reports}"
            ),
            "artifact_paths": [f"{reports}/index.*"],
            "plugins": in_image(gpus=False),
            "agents": {"queue": "cpu"},
            "soft_fail": [{"exit_status": 3}],
        }
    )
    return {"steps": steps}
