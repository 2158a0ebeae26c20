"""Calibration arms: the planted-slowdown plugin adds exactly the asked work to the steps asked,
is inert without its opt-in, refuses a vLLM with no runner it knows, and every report labels the arm."""

import importlib
import json
import sys
import time
import types

import pytest

from vse.errors import ScenarioError
from vse.orchestration.scenario_check import load_scenario
from vse.server import planted
from vse.server.plugin_staging import PLUGINS

sys.path.insert(0, str(PLUGINS / "vse-planted-slowdown"))
plugin = importlib.import_module("vse_planted_slowdown")


def sched(per_req: dict[str, int]):
    return types.SimpleNamespace(num_scheduled_tokens=per_req, total_num_scheduled_tokens=sum(per_req.values()))


def runner_class():
    class Runner:
        calls = 0

        def execute_model(self, scheduler_output, *a, **kw):
            Runner.calls += 1
            return "out"

    return Runner


def timed(cls, s) -> float:
    t = time.perf_counter()
    assert cls().execute_model(s) == "out"
    return (time.perf_counter() - t) * 1000


def test_cpu_work_is_added_to_the_steps_asked_and_said_once(capsys, monkeypatch):
    """Which steps get the work is counted, not timed (a busy machine stretches any short step);
    the one timing kept is a lower bound, which load cannot break."""
    cls = runner_class()
    plugin.wrap(cls, {"cpu_ms_per_step": 20, "steps": "decode"})
    assert timed(cls, sched({"a": 1, "b": 1})) >= 20  # decode: slowed by the real busy wait
    spun: list[float] = []
    monkeypatch.setattr(plugin, "busy_wait", spun.append)
    for step in ({"a": 1, "b": 1}, {"a": 512, "b": 1}, {}):  # decode, prefill, nothing scheduled
        assert cls().execute_model(sched(step)) == "out"
    assert spun == [20.0]
    err = capsys.readouterr().err
    assert err.count(plugin.APPLIED) == 1 and "cpu_ms_per_step=20 steps=decode" in err
    plugin.wrap(cls, {"cpu_ms_per_step": 20})  # a second wrap (a subclass, a second plugin load) adds nothing
    cls().execute_model(sched({"a": 1}))
    assert spun == [20.0, 20.0]


def test_prefill_steps_are_told_from_decode_steps():
    assert plugin.step_kind(sched({"a": 1, "b": 1})) == "decode"
    assert plugin.step_kind(sched({"a": 2048})) == "prefill"
    assert plugin.step_kind(sched({})) is None


def test_inert_without_the_opt_in_and_loud_on_an_unknown_vllm(monkeypatch):
    monkeypatch.delenv(plugin.ENV, raising=False)
    assert plugin.register() is None
    monkeypatch.setenv(plugin.ENV, json.dumps({"gpu_ms_per_step": 1}))
    monkeypatch.setattr(plugin, "RUNNERS", (("no_such_vllm.worker", "Runner"),))
    with pytest.raises(plugin.PlantError, match="none of the model runners"):
        plugin.register()


def test_the_v2_model_runner_is_the_first_it_patches():
    """vLLM 0.26 on a GPU runs vllm.v1.worker.gpu.model_runner.GPUModelRunner; a patch only on the
    old gpu_model_runner class does nothing there."""
    assert plugin.RUNNERS[0] == ("vllm.v1.worker.gpu.model_runner", "GPUModelRunner")


def test_a_server_log_without_the_applied_line_is_refused(tmp_path):
    line = f"(EngineCore pid=1) {planted.APPLIED} x.CPUModelRunner.execute_model: cpu_ms_per_step=5"
    assert planted.check_applied("candidate", "start\n" + line + "\n", tmp_path / "log").startswith(planted.APPLIED)
    with pytest.raises(Exception, match="never ran"):
        planted.check_applied("candidate", "INFO all fine\n", tmp_path / "log")


def test_the_scenario_key_and_its_refusals():
    s = load_scenario("scenarios/cpu-smoke.yaml", overrides=["arms.candidate.planted_slowdown={cpu_ms_per_step: 5}"])
    assert s.arms.candidate.planted_slowdown.cpu_ms_per_step == 5
    assert planted.describe(s.arms.candidate) == "+5 ms CPU per engine step"
    for bad in ("{}", "{gpu_ms_per_step: -1}", "{cpu_ms: 5}", "{gpu_ms_per_step: 1, steps: some}"):
        with pytest.raises(ScenarioError):
            load_scenario("scenarios/cpu-smoke.yaml", overrides=[f"arms.candidate.planted_slowdown={bad}"])


def test_the_staged_plugin_has_its_entry_point_and_the_env_names_the_work(tmp_path):
    s = load_scenario("scenarios/cpu-smoke.yaml", overrides=["arms.candidate.planted_slowdown={gpu_ms_per_step: 0.8}"])
    path = planted.stage(tmp_path)
    assert (tmp_path / "vse_planted_slowdown" / "__init__.py").is_file()
    assert (
        "vse_planted_slowdown:register"
        in (tmp_path / "vse_planted_slowdown-0.1.0.dist-info" / "entry_points.txt").read_text()
    )
    env = planted.server_env(path, s.arms.candidate, {"PYTHONPATH": "/x"})
    assert env["PYTHONPATH"] == f"{path}:/x" and json.loads(env[planted.ENV])["gpu_ms_per_step"] == 0.8
