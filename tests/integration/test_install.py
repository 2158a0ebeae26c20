"""`pip install .` makes a `vse` that works outside the checkout: the wheel carries the scenarios
and the vLLM plugins, and paths are the caller's."""

from __future__ import annotations

import os
import subprocess
import sys

from conftest import ROOT

from vse.errors import tail


def test_an_installed_vse_checks_a_shipped_scenario_from_any_directory(tmp_path):
    target, elsewhere = tmp_path / "site", tmp_path / "elsewhere"
    elsewhere.mkdir()
    # the suite's dependencies are this environment's; the package itself comes from the wheel
    r = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, tail(r.stderr, 3000)
    env = {**os.environ, "PYTHONPATH": str(target)}
    where = subprocess.run(
        [sys.executable, "-c", "import vse; print(vse.__file__)"],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert where.stdout.startswith(str(target)), where  # the installed copy, not the checkout
    assert (target / "vse" / "scenarios" / "cpu-smoke.yaml").is_file()
    assert (target / "vse" / "plugins" / "vse-planted-slowdown" / "vse_planted_slowdown" / "__init__.py").is_file()
    vse = [sys.executable, str(target / "bin" / "vse")]
    for name in ("cpu-smoke", "scenarios/cpu-smoke.yaml", "cpu-smoke.yaml"):
        r = subprocess.run(
            [*vse, "check", "--scenario", name], cwd=elsewhere, env=env, capture_output=True, text=True, timeout=120
        )
        assert r.returncode == 0 and "ok (cpu-smoke: fp32 vs bf16)" in r.stdout, (name, tail(r.stderr))
    r = subprocess.run([*vse, "--version"], cwd=elsewhere, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.startswith("vse 0.")
    # a path where the caller stands wins over the shipped scenario of that name
    own = elsewhere / "cpu-smoke.yaml"
    own.write_text((ROOT / "scenarios" / "cpu-smoke.yaml").read_text().replace("name: cpu-smoke", "name: mine"))
    r = subprocess.run(
        [*vse, "check", "--scenario", "cpu-smoke.yaml"],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "ok (mine:" in r.stdout, tail(r.stderr)
