"""Every pipeline step's command as a fresh Buildkite agent runs it: `bash -e -c` on the command
after Buildkite's own interpolation ($$ -> $, {{matrix}}), in a clean work folder, with the real
bin/vse and bin/ci-step. The real buildkite-agent is not installable here (a Go binary from
Buildkite's releases, not a registry package), so a stand-in on PATH records each call, its
arguments and its input, and serves `artifact download` from a folder the test fills: what is
under test is what the step does with the agent, not the agent.

The GPU steps' comparisons are refused here by the real preflight (no GPU: exit 4, in seconds),
which is what a step does on a wrong agent; the trend step ingests real runs (the committed CPU
examples' raw data) and damaged ones."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, needs_server

from vse.errors import tail
from vse.rundir.packed import unpack

EX = ROOT / "reports" / "examples"
AGENT = """#!/usr/bin/env bash
# buildkite-agent stand-in: records the call, serves artifact download from $ARTIFACTS
printf '%s\\n' "$*" >> "$AGENT_LOG"
if [ "$1" = annotate ]; then cat > "$AGENT_LOG.annotation.$(date +%s%N)"; fi
if [ "$1 $2" = "pipeline upload" ]; then cat > "$AGENT_LOG.pipeline"; fi
if [ "$1 $2" = "artifact download" ]; then
  [ -d "${ARTIFACTS:-}" ] || exit 1
  cp -r "$ARTIFACTS"/. "$4"
fi
exit 0
"""


def steps(pipeline: str) -> dict[str, dict]:
    return {s["key"]: s for s in yaml.safe_load((ROOT / ".buildkite" / pipeline).read_text())["steps"] if "key" in s}


def as_agent_runs_it(command: str, **matrix: str) -> str:
    """Buildkite's upload-time interpolation of what the suite's pipelines use: $$ and the matrix."""
    for k, v in matrix.items():
        command = command.replace("{{" + k + "}}", v)
    return command.replace("$$", "$")


@pytest.fixture
def agent(tmp_path):
    """A clean agent work folder (the checkout's bin, eval and scenarios), the stand-in agent on PATH."""
    work = tmp_path / "work"
    work.mkdir()
    for d in ("bin", "eval", "scenarios", "docker"):
        (work / d).symlink_to(ROOT / d)
    tools = tmp_path / "tools"
    tools.mkdir()
    (tools / "buildkite-agent").write_text(AGENT)
    (tools / "buildkite-agent").chmod(0o755)
    log = tmp_path / "agent.log"
    env = {
        "PATH": f"{tools}:{Path(sys.executable).parent}:/usr/bin:/bin",
        "AGENT_LOG": str(log),
        "PY": sys.executable,  # bin/vse with this environment's interpreter (the image's PY=...)
        "HOME": str(tmp_path),
        "VSE_CACHE": str(tmp_path / "cache"),
    }

    def run(command: str, prefix: tuple[str, ...] = (), **extra: str) -> tuple[int, str, list[tuple[str, str]]]:
        r = subprocess.run(
            [*prefix, "bash", "-e", "-c", command],
            cwd=work,
            env={**env, **extra},
            capture_output=True,
            text=True,
            timeout=600,
        )
        calls = log.read_text().splitlines() if log.is_file() else []
        notes = sorted(tmp_path.glob("agent.log.annotation.*"))
        annotations = [(c, n.read_text()) for c, n in zip([c for c in calls if c.startswith("annotate")], notes)]
        return r.returncode, r.stdout + r.stderr, annotations

    run.work = work  # type: ignore[attr-defined]
    run.env = env  # type: ignore[attr-defined]
    return run


@pytest.mark.parametrize(
    "pipeline, key, matrix",
    [
        ("nightly.yml", "nightly-matrix", {"matrix.scenario": "h200-llama3.1-8b-fp8-dummy", "matrix.backend": "torch"}),
        ("nightly.yml", "nightly-flashinfer", {"matrix": "llama3-8b-fp8-isl1024-osl1024-c128"}),
        ("pipeline.yml", "gpu-ab", {}),
        ("pipeline.yml", "gpu-ab-flashinfer", {}),
    ],
)
def test_a_gpu_step_on_an_agent_without_a_gpu_is_refused_annotated_and_soft(agent, pipeline, key, matrix):
    """Refused in seconds by the preflight, before any setup or download (the h200 scenario's
    tokenizer would come from npm), annotated with the cause, soft."""
    step = steps(pipeline)[key]
    code, out, notes = agent(as_agent_runs_it(step["command"], **matrix))
    assert code == 4, tail(out)
    assert {"exit_status": 4} in step["soft_fail"]
    ((call, text),) = notes
    assert "--style warning" in call and "exit 4 (unsupported here)" in text
    assert re.search(r"no NVIDIA GPU is visible here|needs 1 GPUs; 0 visible", text)  # the cause
    assert "npm" not in out and "setup:" not in out


def test_the_image_step_without_a_registry_fails_loudly(agent):
    code, out, notes = agent(as_agent_runs_it(steps("nightly.yml")["image"]["command"]))
    assert code == 2 and "VSE_REGISTRY is not set" in out
    ((call, text),) = notes
    assert "--style error" in call and "VSE_REGISTRY is not set" in text
    assert "the GPU steps and the trend, which run in it, are skipped" in text  # what a failed image takes down
    trend = steps("nightly.yml")["trend"]
    assert trend["depends_on"] == "image"  # skipped without its image, not started to die in docker pull


def nights(artifacts: Path) -> None:
    """Tonight's artifacts: two finished runs, one whose run.json was cut off mid-write, one unfinished."""
    unpack(EX / "cpu-smoke", artifacts / "reports", "20261201T020000Z-cpu-smoke-none")
    unpack(EX / "cpu-smoke-aa", artifacts / "reports", "20261202T020000Z-cpu-smoke-none")
    cut = unpack(EX / "cpu-smoke", artifacts / "reports", "20261203T020000Z-cut")
    (cut / "run.json").write_text((cut / "run.json").read_text()[:40])
    failed = unpack(EX / "cpu-smoke-aa", artifacts / "reports", "20261203T030000Z-failed")
    meta = json.loads((failed / "run.json").read_text())
    (failed / "run.json").write_text(json.dumps({**meta, "status": "failed"}))


def test_the_trend_step_lists_a_damaged_run_goes_on_and_annotates_its_failure(agent, tmp_path):
    artifacts = tmp_path / "artifacts"
    nights(artifacts)
    shutil.copytree(EX / "cpu-smoke", agent.work / "reports" / "examples" / "cpu-smoke")  # a checkout's examples
    db = tmp_path / "history.sqlite"
    step = steps("nightly.yml")["trend"]
    code, out, notes = agent(as_agent_runs_it(step["command"]), VSE_HISTORY_URL=str(db), ARTIFACTS=str(artifacts))
    assert code == 2, tail(out, 3000)  # a run could not be read: the worst meaningful outcome
    ((call, text),) = notes
    assert "--style error" in call and "--context trend" in call
    assert re.search(r"refused: \S*20261203T020000Z-cut: damaged \(JSONDecodeError", text)
    assert "20261203T030000Z-failed: status failed (not finished)" in text
    assert "20261201T020000Z-cpu-smoke-none: 8 run-level rows added" in text
    assert "20261202T020000Z-cpu-smoke-none: 8 run-level rows added" in text
    assert "skipped: 1 committed examples under reports" in text  # examples stay out of the series
    assert "| Series | Metric | Nights |" in text  # the trend itself was built after the damaged run
    # the next night, with the damaged run gone: everything read, nothing new, green
    shutil.rmtree(artifacts / "reports" / "20261203T020000Z-cut")
    shutil.rmtree(agent.work / "reports" / "20261203T020000Z-cut")
    code, out, notes = agent(as_agent_runs_it(step["command"]), VSE_HISTORY_URL=str(db), ARTIFACTS=str(artifacts))
    assert code == 0, tail(out, 3000)
    assert notes[-1][1].count("already in the history") == 2 and "--style success" in notes[-1][0]


def test_the_trend_step_without_a_central_history_says_so(agent, tmp_path):
    code, out, notes = agent(as_agent_runs_it(steps("nightly.yml")["trend"]["command"]))
    assert code == 2 and "VSE_HISTORY_URL" in out
    assert "no run directories from tonight's steps" in out  # the download found nothing: said, not fatal
    ((call, text),) = notes
    assert "--style error" in call and "the history database is empty" in text


def test_the_release_index_step_folds_entries_and_annotates(agent, tmp_path, monkeypatch):
    """The dynamic pipeline's last step on a one-GPU agent's results: TP2 and TP4 refused."""
    from vse.orchestration import qualify

    monkeypatch.setenv("CANDIDATE_VLLM_PYTHON", "/x/bin/python")
    suite = qualify.load_suite("release")
    index = qualify.pipeline(suite)["steps"][-1]
    artifacts = tmp_path / "artifacts"
    out = artifacts / "reports" / "qualify"
    out.mkdir(parents=True)
    for i, e in enumerate(suite.runs, 1):
        if e.backend != "flashinfer":  # its step was skipped: no Blackwell queue
            code = 4 if "tp" in Path(e.scenario).stem.split("-")[-1] else 0
            (out / f"entry-{i}.json").write_text(
                json.dumps(
                    {
                        "exit_code": code,
                        "outcome": qualify.OUTCOME[code],
                        "scenario": e.scenario,
                        "backend": e.backend,
                        "set": [],
                        "run": None,
                        "message": "",
                        "headline": "",
                        "gates": [],
                    }
                )
            )
    code, text, notes = agent(
        as_agent_runs_it(index["command"]), ARTIFACTS=str(artifacts), CANDIDATE_VLLM_PYTHON="/x/bin/python"
    )
    assert code == 3, tail(text, 3000)
    ((call, note),) = notes
    assert "--style warning" in call and "**INCONCLUSIVE** (exit 3)" in note and "NOT RUN" in note
    assert {"exit_status": 3} in index["soft_fail"]


def test_ci_step_keeps_the_exit_code_without_an_agent(tmp_path):
    """A laptop: no buildkite-agent on PATH; the command's code comes through and the step says why
    nothing was annotated."""
    r = subprocess.run(
        [str(ROOT / "bin" / "ci-step"), "x", "--report", "/nonexistent", "--", "bash", "-c", "echo boom; exit 7"],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin"},
        timeout=60,
    )
    assert r.returncode == 7 and "boom" in r.stdout and "no buildkite-agent on PATH" in r.stderr
    assert os.access(ROOT / "bin" / "ci-step", os.X_OK)


def test_a_cancelled_step_is_annotated_stops_its_command_and_leaves_nothing(agent, tmp_path):
    """Buildkite cancels a job (or its timeout fires) by signalling the job's process group: ci-step
    passes the signal to its command's own group (vLLM servers included), annotates "cancelled" with
    the last lines before the agent's grace ends, removes its temporary files, exits 128 + 15."""
    import signal
    import time

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    pid_file = tmp_path / "child.pid"
    command = f"bin/ci-step cancel-me --report /nonexistent -- bash -c 'echo measuring; sleep 300 & echo $! > {pid_file}; wait'"
    p = subprocess.Popen(
        ["bash", "-e", "-c", command],
        cwd=agent.work,
        env={**agent.env, "TMPDIR": str(tmp)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # the job's process group, as the agent starts it
    )
    for _ in range(100):
        if pid_file.is_file() and pid_file.read_text().strip():
            break
        time.sleep(0.1)
    child = int(pid_file.read_text())
    t0 = time.monotonic()
    os.killpg(p.pid, signal.SIGTERM)
    out, _ = p.communicate(timeout=60)
    assert p.returncode == 128 + 15, out
    assert time.monotonic() - t0 < 10  # inside the agent's default 10 s cancel grace
    calls = (tmp_path / "agent.log").read_text()
    assert "annotate --style error --context cancel-me" in calls
    (note,) = [n.read_text() for n in tmp_path.glob("agent.log.annotation.*")]
    assert "cancelled after" in note and "SIGTERM" in note and "measuring" in note
    with pytest.raises(ProcessLookupError):
        os.kill(child, 0)  # the command's own children were stopped too
    assert list(tmp.iterdir()) == []  # no temporary log left behind


def test_a_cancel_annotation_keeps_the_commands_closing_line_and_its_run_folder(agent, tmp_path):
    """The suite stops its servers on SIGTERM and prints its closing line then: the annotation waits
    for it (inside the agent's grace), and names the run folder the command made."""
    import signal
    import time

    reports = agent.work / "reports-cancel"
    reports.mkdir()
    ready = tmp_path / "ready"
    closing = "sleep 1; echo error: interrupted, servers stopped; exit 2"
    command = (
        f"bin/ci-step cancel-me --run-in {reports} -- bash -c "
        f'\'trap "{closing}" TERM; sleep 1; mkdir {reports}/20261207T000000Z-run; echo measuring; touch {ready}; '
        "sleep 300 & wait'"
    )
    p = subprocess.Popen(
        ["bash", "-e", "-c", command],
        cwd=agent.work,
        env=agent.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    for _ in range(100):
        if ready.is_file():
            break
        time.sleep(0.1)
    t0 = time.monotonic()
    os.killpg(p.pid, signal.SIGTERM)
    out, _ = p.communicate(timeout=60)
    assert p.returncode == 128 + 15 and time.monotonic() - t0 < 10, out
    (note,) = [n.read_text() for n in tmp_path.glob("agent.log.annotation.*")]
    assert "error: interrupted, servers stopped" in note and "measuring" in note, note
    assert f"Run folder: `{reports}/20261207T000000Z-run`" in note


def test_a_failing_command_that_is_not_vse_is_the_step_failing_not_a_gate(agent):
    """Exit 1 means "a gate failed" only from vse: a failed `docker build` is the step failing."""
    code, _, notes = agent("bin/ci-step image --report /dev/null -- bash -c 'echo no space left on device; exit 1'")
    ((call, text),) = notes
    assert code == 1 and "--style error" in call
    assert "exit 1 (the step failed: bash exited 1)" in text and "gate failed" not in text


def test_the_release_upload_step_emits_a_pipeline_the_agent_uploads(agent):
    step = steps("release.yml")["upload"]
    code, out, _ = agent(as_agent_runs_it(step["command"]), CANDIDATE_VLLM_PYTHON="/x/bin/python")
    assert code == 0, tail(out)
    assert "pipeline upload" in (agent.work.parent / "agent.log").read_text()
    assert "qualify-index" in (agent.work.parent / "agent.log.pipeline").read_text()  # what vse emitted


def test_a_release_upload_whose_vse_fails_fails_the_step_and_annotates(agent):
    """Without pipefail the upload's own success hid vse's failure (a release with no entries)."""
    step = steps("release.yml")["upload"]
    command = as_agent_runs_it(step["command"]).replace("--suite release", "--suite no-such-suite")
    code, out, notes = agent(command)
    assert code == 2, tail(out)
    ((call, text),) = notes
    assert "--style error --context release-upload" in call and "no-such-suite" in text


def test_a_release_entry_on_an_agent_without_a_gpu_is_refused_and_leaves_its_result(agent, monkeypatch):
    """An entry step (the dynamic pipeline's) with a candidate wheel named: the wheel's folder is
    this build's own; the entry is refused in seconds and still leaves entry-N.json for the index."""
    from vse.orchestration import qualify

    monkeypatch.setenv("CANDIDATE_VLLM_PYTHON", "/x/bin/python")
    entry = qualify.pipeline(qualify.load_suite("release"))["steps"][0]
    code, out, notes = agent(as_agent_runs_it(entry["command"]), CANDIDATE_VLLM_PYTHON="/x/bin/python")
    assert code == 4, tail(out)
    result = json.loads((agent.work / "reports" / "qualify" / "entry-1.json").read_text())
    assert result["exit_code"] == 4 and result["outcome"].startswith("UNSUPPORTED")
    ((call, _),) = notes
    assert "--style warning" in call and "--context release-1" in call


def _wheel(folder: Path) -> Path:
    """A minimal wheel standing for a candidate vLLM build: what the entry installs, offline."""
    import zipfile

    whl = folder / "candidate_probe-0.1-py3-none-any.whl"
    info = "candidate_probe-0.1.dist-info"
    files = {
        "candidate_probe/__init__.py": "",
        f"{info}/METADATA": "Metadata-Version: 2.1\nName: candidate-probe\nVersion: 0.1\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    with zipfile.ZipFile(whl, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
        z.writestr(f"{info}/RECORD", "".join(f"{n},,\n" for n in [*files, f"{info}/RECORD"]))
    return whl


def test_two_release_entries_of_one_build_side_by_side_on_one_host_both_finish(tmp_path):
    """Hosts with 8 GPUs run 8 agents: a build's entries start seconds apart on one host, each in
    its agent's checkout, with one TMPDIR. Each builds its candidate's environment in a folder of its
    own job (one per build was removed under the other entry), installs the wheel with nothing
    fetched, and both end refused here (no GPU) with their result and annotation."""
    from vse.orchestration import qualify

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    whl = _wheel(tmp_path)
    entry = qualify.pipeline(qualify.load_suite("release"))["steps"][0]
    procs = []
    for job in ("job-a", "job-b"):
        home = tmp_path / job
        work, tools = home / "work", home / "tools"
        work.mkdir(parents=True)
        tools.mkdir()
        for d in ("bin", "eval", "scenarios", "docker"):
            (work / d).symlink_to(ROOT / d)
        (tools / "buildkite-agent").write_text(AGENT)
        (tools / "buildkite-agent").chmod(0o755)
        env = {
            "PATH": f"{tools}:{Path(sys.executable).parent}:/usr/bin:/bin",
            "AGENT_LOG": str(home / "agent.log"),
            "PY": sys.executable,
            "HOME": str(home),
            "VSE_CACHE": str(home / "cache"),
            "TMPDIR": str(tmp),
            "BUILDKITE_BUILD_ID": "build-1",  # the same build
            "BUILDKITE_JOB_ID": job,
            "CANDIDATE_VLLM_WHEEL": str(whl),
            "PIP_NO_INDEX": "1",
        }
        procs.append(
            (
                home,
                subprocess.Popen(
                    ["bash", "-e", "-c", as_agent_runs_it(entry["command"])],
                    cwd=work,
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                ),
            )
        )
    for home, p in procs:
        out, _ = p.communicate(timeout=600)
        assert p.returncode == 4, tail(out)  # refused here: no GPU, after the wheel installed
        assert "No module named" not in out and "Traceback" not in out
        result = json.loads((home / "work" / "reports" / "qualify" / "entry-1.json").read_text())
        assert result["exit_code"] == 4
        assert "annotate --style warning --context release-1" in (home / "agent.log").read_text()
    assert list(tmp.glob("vllm-candidate-*")) == []  # each job removed its own folder


# What a download attempt prints, offline or not (pip quiet or not, npm, the suite's setup, resolvers)
FETCHING = (
    "pip install",
    "Collecting ",
    "Downloading ",
    "No matching distribution",
    "Could not find a version",
    "npm ",
    "setup: ",
    "Temporary failure in name resolution",
    "Network is unreachable",
)


def _offline_ok() -> bool:
    return subprocess.run(["unshare", "-n", "true"], capture_output=True, timeout=30).returncode == 0


@pytest.mark.skipif(not _offline_ok(), reason="this kernel lets no process take a network namespace of its own")
def test_every_nightly_and_release_step_fetches_nothing_at_run_time(agent, tmp_path):
    """Each step's command as the agent runs it in the image (PY: the image's Python), in a network
    namespace with no route: nothing is installed or downloaded, and every step still ends in its
    own exit code with an annotation."""
    from vse.orchestration import qualify

    cases = [
        (f"nightly {k}", s, m)
        for k, s, m in (
            ("image", steps("nightly.yml")["image"], {}),
            (
                "nightly-matrix",
                steps("nightly.yml")["nightly-matrix"],
                {"matrix.scenario": "h200-llama3.1-8b-fp8-dummy", "matrix.backend": "torch"},
            ),
            ("trend", steps("nightly.yml")["trend"], {}),
            ("upload", steps("release.yml")["upload"], {}),
        )
    ]
    emitted = qualify.pipeline(qualify.load_suite("release"))["steps"]
    cases += [("release entry", emitted[0], {}), ("release index", emitted[-1], {})]
    seen = 0
    for name, step, matrix in cases:
        code, out, notes = agent(as_agent_runs_it(step["command"], **matrix), prefix=("unshare", "-n"))
        for fetch in FETCHING:
            assert fetch not in out, f"{name}: {fetch!r} offline:\n{tail(out, 1500)}"
        assert code in (0, 2, 3, 4), f"{name}: exit {code}\n{tail(out, 1500)}"
        assert len(notes) > seen, f"{name}: no annotation"
        seen = len(notes)


def test_the_bisect_pipeline_plans_its_first_round_and_every_round_is_valid_shell(agent, tmp_path):
    """.buildkite/bisect.yml's first step as an agent runs it: the bisection's folder made, its
    bisect.json uploaded as an artifact, the first round (the bad end, then the collect step)
    uploaded as a pipeline; every command of that round parses under bash -e once interpolated."""
    builds = agent.work / "builds.yaml"
    builds.write_text(json.dumps({"builds": [{"id": f"b{i}", "python": sys.executable} for i in range(5)]}))
    step = steps("bisect.yml")["bisect-plan"]
    code, out, notes = agent(
        as_agent_runs_it(step["command"]),
        BISECT_SCENARIO="scenarios/cpu-smoke.yaml",
        BISECT_BUILDS="builds.yaml",
        BISECT_AGENTS="3",
    )
    assert code == 0, tail(out)
    calls = (tmp_path / "agent.log").read_text().splitlines()
    assert "artifact upload reports/*-bisect-*/bisect.json" in calls  # the agent expands the glob itself
    (state,) = (agent.work / "reports").glob("*-bisect-cpu-smoke/bisect.json")
    assert json.loads(state.read_text())["steps"] == []
    assert "pipeline upload reports/bisect-round.yml" in calls
    round_ = yaml.safe_load((agent.work / "reports" / "bisect-round.yml").read_text())["steps"]
    assert "--only b4" in round_[0]["command"] and "--collect --agents 3" in round_[-1]["command"]
    for s in round_:
        if "command" in s:
            r = subprocess.run(
                ["bash", "-n", "-e", "-c", as_agent_runs_it(s["command"])], capture_output=True, text=True
            )
            assert r.returncode == 0, (s["key"], r.stderr)


def test_the_nightlys_opt_in_bisection_plans_the_trends_regression_or_says_there_is_none(agent, tmp_path):
    """nightly.yml's bisect step as an agent runs it, after a trend that found a regression: the
    vLLM commits between the two nights (a clone on the host), each a wheel from the template, the
    regressed arm on both sides; its first round uploaded. With no open regression it uploads nothing."""
    git = lambda *a: subprocess.run(["git", "-C", str(repo), *a], check=True, capture_output=True, text=True)
    repo = tmp_path / "vllm.git"
    repo.mkdir()
    git("init", "-q")
    shas = []
    for i in range(5):
        git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", f"c{i}")
        shas.append(git("rev-parse", "HEAD").stdout.strip())
    reg = {"scenario": "cpu-smoke", "arm": "candidate", "backend": "none", "series": "cpu-smoke / candidate"}
    reg |= {"metric": "output_throughput", "change_pct": -3.0}
    reg |= {"last_good": {"run": "n1", "vllm": f"0.26.1.dev1+g{shas[0][:9]}"}}
    reg |= {"first_bad": {"run": "n2", "vllm": f"0.26.1.dev5+g{shas[4][:9]}"}}
    artifacts = tmp_path / "artifacts"
    (artifacts / "reports" / "trend").mkdir(parents=True)
    trend = artifacts / "reports" / "trend" / "trend.json"
    trend.write_text(json.dumps({"open_regressions": [reg]}))
    step = steps("nightly.yml")["bisect"]
    assert step["if"] == 'build.env("VSE_BISECT_WHEELS") != null'  # opt-in
    env = {"ARTIFACTS": str(artifacts), "VSE_VLLM_GIT": str(repo), "BISECT_AGENTS": "2"}
    offline = ("unshare", "-n") if _offline_ok() else ()  # as every nightly step: nothing fetched
    code, out, notes = agent(
        as_agent_runs_it(step["command"]), prefix=offline, VSE_BISECT_WHEELS="file:///w/{id}.whl", **env
    )
    assert code == 0, tail(out)
    assert not any(fetch in out for fetch in FETCHING) and notes  # annotated, like every step
    (state,) = (agent.work / "reports").glob("*-bisect-cpu-smoke/bisect.json")
    s = json.loads(state.read_text())
    assert [b["id"] for b in s["builds"]] == shas and s["builds"][2]["wheel"] == f"file:///w/{shas[2]}.whl"
    assert s["arm"] == "candidate"
    round_ = yaml.safe_load((agent.work / "reports" / "bisect-round.yml").read_text())["steps"]
    assert f"--only {shas[4]}" in round_[0]["command"]
    calls = (tmp_path / "agent.log").read_text().splitlines()
    assert "pipeline upload reports/bisect-round.yml" in calls
    (tmp_path / "agent.log").unlink()
    trend.write_text(json.dumps({"open_regressions": []}))
    code, out, _ = agent(as_agent_runs_it(step["command"]), VSE_BISECT_WHEELS="file:///w/{id}.whl", **env)
    assert code == 0 and "holds no open regression: nothing to bisect" in out, tail(out)
    assert not any(c.startswith("pipeline upload") for c in (tmp_path / "agent.log").read_text().splitlines())


@needs_server
def test_a_wedged_vse_killed_under_ci_step_leaves_no_vllm_process(agent, tmp_path):
    """vse frozen mid-run (SIGSTOP) acts on no signal: the cancel's SIGTERM does nothing, ci-step's
    SIGKILL after its grace reaches vse's group and not the servers' (each has its own). Each
    server's watchdog sees the suite gone and kills its group: no vLLM process is left."""
    import signal
    import time

    from conftest import CACHE, vllm_ports_alive

    reports = agent.work / "reports"
    small = "--set workload.num_prompts=8 --set workload.dataset.output_len=32 --set run.server_starts=1"
    command = f"bin/ci-step wedge --run-in reports -- bin/vse compare --scenario scenarios/cpu-smoke.yaml --reports reports {small}"
    p = subprocess.Popen(
        ["bash", "-e", "-c", command],
        cwd=agent.work,
        env={**agent.env, "VSE_CACHE": str(CACHE)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not [
        lg for lg in reports.glob("*/*/server-*.log") if lg.stat().st_size > 2000
    ]:
        time.sleep(0.5)
    (run,) = [d for d in reports.iterdir() if d.is_dir()]
    vse = [
        int(pid)
        for pid in filter(str.isdigit, os.listdir("/proc"))
        if b"vse.cli\0compare" in Path(f"/proc/{pid}/cmdline").read_bytes()
    ]
    assert len(vse) == 1 and vllm_ports_alive(run)
    os.kill(vse[0], signal.SIGSTOP)  # wedged
    os.killpg(p.pid, signal.SIGTERM)  # the cancel
    out, _ = p.communicate(timeout=60)
    assert p.returncode == 128 + 15, out
    deadline = time.monotonic() + 30
    while vllm_ports_alive(run) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert vllm_ports_alive(run) == []
