"""`vse bisect` over wheels: builds named by a wheel file, a URL or a template of the build's id, each
installed once into an environment of the bisection's own over `wheel_python`'s packages, and run by
that environment's Python. Real venvs and real pip installs of small handmade wheels (offline), with
a stand-in for `vse compare` (tests/integration/test_bisect_cpu.py runs real comparisons)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from vse.errors import SuiteError
from vse.exitcodes import ExitCode
from vse.models import provision
from vse.orchestration import bisect


def fake_wheel(folder: Path, version: str) -> Path:
    """A real (tiny) wheel of a package `fakevllm` whose module says its version: pip installs it as it
    would a vLLM wheel, offline."""
    import zipfile

    name = f"fakevllm-{version}-py3-none-any.whl"
    path = folder / name
    info = f"fakevllm-{version}.dist-info"
    files = {
        "fakevllm.py": f"VERSION = {version!r}\n",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: fakevllm\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    files[f"{info}/RECORD"] = "".join(f"{f},,\n" for f in files) + f"{info}/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as z:
        for f, text in files.items():
            z.writestr(f, text)
    return path


def test_builds_from_a_wheel_template_are_installed_once_each_and_run_by_their_own_python(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    for v in ("1", "2", "3"):
        fake_wheel(wheels, v)
    spec = {
        "wheel_template": f"file://{wheels}/fakevllm-{{id}}-py3-none-any.whl",
        "wheel_python": sys.executable,
        "builds": [{"id": "1"}, {"id": "2"}, {"id": "3"}],
    }
    (tmp_path / "builds.yaml").write_text(json.dumps(spec))
    state, builds = bisect.new_state(
        "scenarios/cpu-smoke.yaml", str(tmp_path / "builds.yaml"), [], tmp_path, None, None
    )
    assert builds.builds[1].wheel == f"file://{wheels}/fakevllm-2-py3-none-any.whl"
    seen = []

    def runner(argv):  # each arm's Python has its own build's wheel, installed before its comparison
        for arm in ("baseline", "candidate"):
            py = json.loads(next(a for a in argv if a.startswith(f"arms.{arm}=")).split("=", 1)[1])["vllm"]["python"]
            seen.append(
                subprocess.run(
                    [py, "-c", "import fakevllm; print(fakevllm.VERSION)"], capture_output=True, text=True
                ).stdout.strip()
            )
        return ExitCode.GATE_FAILED if seen[-1] == "3" else ExitCode.OK

    assert bisect.run_bisect(state, builds, log=lambda m: None, runner=runner) == ExitCode.OK
    assert seen == ["1", "3", "1", "2"] and state["answer"]["culprit"] == "3"
    envs = sorted(p.name for p in (Path(state["folder"]) / "envs").iterdir() if p.is_dir())
    assert envs == ["1", "2", "3"]  # the good end's installed once, for both steps
    resumed, again = bisect.resume_state(Path(state["folder"]))
    assert again.wheel_python == sys.executable and again.builds[0].wheel == builds.builds[0].wheel


def test_a_wheel_that_cannot_be_installed_is_one_line_and_leaves_no_environment(tmp_path):
    venv = tmp_path / "envs" / "b1"
    with pytest.raises(SuiteError, match=r"^setup: pip install /nope/fakevllm-1-py3-none-any.whl failed \(exit 1\)"):
        provision.install_wheel_env(venv, "/nope/fakevllm-1-py3-none-any.whl", sys.executable)
    assert not venv.exists()
    with pytest.raises(SuiteError, match=r"wheel_python /no/python: not found"):
        provision.install_wheel_env(venv, "x.whl", "/no/python")
