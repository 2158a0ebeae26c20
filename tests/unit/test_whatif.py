"""The what-if arm (FlashInfer's per-tensor FP8 GEMM below compute capability 10.0): the plugin's
patch and version guard, the opt-in and the labels in every report format."""

import importlib
import subprocess
import sys

import pytest
from conftest import ROOT

from vse.errors import ScenarioError, UnsupportedError, tail
from vse.orchestration.scenario_check import load_scenario
from vse.server import preflight, whatif
from vse.server.process import ServerConfig

sys.path.insert(0, str(whatif.PLUGIN_DIR))
plugin = importlib.import_module("vse_flashinfer_hopper")
H200 = ROOT / "scenarios" / "h200-llama3.1-8b-fp8-dummy.yaml"


class Kernel:
    @classmethod
    def is_supported(cls, compute_capability=None):
        if compute_capability is not None and compute_capability < 100:
            return False, "requires compute capability 100 and above."
        return True, None


def test_patch_lifts_the_gate_to_8_9_and_nothing_else():
    class K(Kernel):
        pass

    assert K.is_supported(90)[0] is False
    plugin.patch(K)
    assert K.is_supported(90) == (True, None) and K.is_supported(89) == (True, None)
    assert K.is_supported(80)[0] is False and K.is_supported(100) == (True, None)


def test_version_guard_refuses_a_kernel_it_does_not_understand():
    class NoClassmethod:
        def is_supported(self, compute_capability=None):
            return True, None

    class OtherSignature:
        @classmethod
        def is_supported(cls, device=None):
            return True, None

    for k in (NoClassmethod, OtherSignature, object):
        with pytest.raises(plugin.WhatIfError, match="refusing"):
            plugin.patch(k)


def test_register_is_a_no_op_without_the_opt_in(monkeypatch):
    monkeypatch.delenv(plugin.ENV, raising=False)
    monkeypatch.setitem(sys.modules, plugin.MODULE, None)  # an import would raise
    assert plugin.register() is None


def test_the_opt_in_is_required_and_labelled(monkeypatch, tmp_path):
    s = load_scenario(H200, backend="flashinfer")
    assert not s.arms.candidate.whatif
    gpus = [preflight.Gpu(0, "NVIDIA H200", (9, 0), 0, 143771)]
    with pytest.raises(UnsupportedError, match="WHATIF=1 runs it anyway"):
        preflight.check_backends(s, gpus)
    w = load_scenario(H200, backend="flashinfer", overrides=["arms.candidate.whatif=true"])
    preflight.check_backends(w, gpus)  # allowed on Hopper as a what-if
    with pytest.raises(UnsupportedError, match="needs compute capability 8.9"):
        preflight.check_backends(w, [preflight.Gpu(0, "A100", (8, 0), 0, 81920)])
    with pytest.raises(ScenarioError, match="whatif is only for backend flashinfer"):
        load_scenario(H200, backend="torch", overrides=["arms.candidate.whatif=true"])
    plugin_dir = whatif.stage(tmp_path / "p")
    cfg = ServerConfig("candidate", "m", "m", w.server, w.arms.candidate, whatif_plugin=plugin_dir)
    env = cfg.env()
    assert env[whatif.ENV] == "1" and env["PYTHONPATH"].startswith(plugin_dir)
    base = ServerConfig("baseline", "m", "m", w.server, w.arms.baseline, whatif_plugin=plugin_dir).env()
    assert whatif.ENV not in base  # only the opted-in arm


def test_autotune_state_from_a_server_log():
    log = (
        "(EngineCore pid=1) INFO 12-03 05:26:55 [kernel_warmup.py:227] Using FlashInfer autotune cache file: "
        "/root/.cache/vllm/flashinfer_autotune_cache/0.6.14/90a/x.json\n"
        "(EngineCore pid=1) 2026-12-03 05:26:55,916 - INFO - autotuner.py:651 - flashinfer.jit: [Autotuner]: "
        "Autotuning process starts ...\n"
        "(EngineCore pid=1) 2026-12-03 05:29:58,120 - INFO - autotuner.py:674 - flashinfer.jit: [Autotuner]: "
        "Autotuning process ends\n"
    )
    t = whatif.autotune_state(log)
    assert t == {
        "cache_file": "/root/.cache/vllm/flashinfer_autotune_cache/0.6.14/90a/x.json",
        "cache_entries_found": True,
        "autotune_s": 182.2,
    }
    assert (
        whatif.autotune_state(log + "WARNING No FlashInfer autotune cache entries found.")["cache_entries_found"]
        is False
    )
    assert whatif.autotune_state("nothing") is None


def test_every_report_format_labels_the_whatif_arm(tmp_path):
    import json

    import yaml

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from pack_example import unpack

    run = unpack(ROOT / "reports" / "examples" / "cpu-smoke", tmp_path)  # any run: the smallest
    sc = yaml.safe_load((run / "scenario.yaml").read_text())
    sc["arms"]["candidate"].update(backend="flashinfer", whatif=True)
    (run / "scenario.yaml").write_text(yaml.safe_dump(sc))
    servers = json.loads((run / "candidate" / "servers.json").read_text())
    (run / "candidate" / "servers.json").write_text(json.dumps([{**s, "whatif": True} for s in servers]))
    r = subprocess.run(
        [sys.executable, "-m", "vse.cli", "report", str(run)], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert r.returncode in (0, 1, 3), tail(r.stderr)
    for name in ("summary.md", "report.html", "results.json"):
        assert whatif.LABEL in (run / name).read_text(), name
    assert json.loads((run / "results.json").read_text())["arms"]["candidate"]["whatif"] is True
    assert "WHAT-IF)" in (run / "summary.md").read_text()


def test_the_time_budget_counts_flashinfer_tuning_only_where_it_will_tune():
    from vse.server.whatif import AUTOTUNE_ALLOWANCE_S, start_estimate

    fi, cutlass = load_scenario(H200, backend="flashinfer").arms.candidate, load_scenario(H200).arms.baseline
    assert start_estimate(fi, 0, None, 150.0) == 150.0 + AUTOTUNE_ALLOWANCE_S  # vLLM decides: its cache may be cold
    assert start_estimate(fi, 1, None, 150.0) == 150.0  # cached by then
    assert start_estimate(cutlass, 0, None, 150.0) == 150.0
    off = fi.model_copy(update={"whatif": True})  # a what-if arm: default tactics, no tuning
    assert off.autotune is False and start_estimate(off, 0, None, 150.0) == 150.0
    fresh = fi.model_copy(update={"flashinfer_autotune": True})  # tunes at every start
    assert start_estimate(fresh, 3, None, 150.0) == 150.0 + AUTOTUNE_ALLOWANCE_S
    assert start_estimate(fresh, 3, 420.0, 150.0) == 420.0  # this arm's own last start says it best


def test_whatif_arms_run_default_tactics_unless_tuning_is_asked_for(tmp_path):
    w = load_scenario(H200, backend="flashinfer", overrides=["arms.candidate.whatif=true"])
    args = ServerConfig("candidate", "m", "m", w.server, w.arms.candidate).args()
    assert "--no-enable-flashinfer-autotune" in args
    assert not any("autotune" in a for a in ServerConfig("baseline", "m", "m", w.server, w.arms.baseline).args())
    t = load_scenario(
        H200, backend="flashinfer", overrides=["arms.candidate.whatif=true", "arms.candidate.flashinfer_autotune=true"]
    )
    cfg = ServerConfig("candidate", "m", "m", t.server, t.arms.candidate, autotune_cache=str(tmp_path / "c"))
    assert "--enable-flashinfer-autotune" in cfg.args()
    assert cfg.env()["VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR"] == str(tmp_path / "c")
    # vLLM's own default (and its shared cache) on a supported FlashInfer arm
    plain = load_scenario(H200, backend="flashinfer").arms.candidate
    assert plain.autotune is None and not any(
        "autotune" in a for a in ServerConfig("candidate", "m", "m", t.server, plain).args()
    )
    with pytest.raises(ScenarioError, match="flashinfer_autotune is only for backend flashinfer"):
        load_scenario(H200, backend="torch", overrides=["arms.candidate.flashinfer_autotune=false"])
    assert whatif.autotune_state(
        "INFO [kernel_warmup.py:119] Skipping FlashInfer autotune because it is disabled."
    ) == {"disabled": True}
    # the report's note follows what the servers ran with, else (none started yet) the scenario
    assert whatif.tactics_mode([{"argv": ["serve", "--no-enable-flashinfer-autotune"]}], plain) is False
    assert whatif.tactics_mode([{"argv": ["serve"]}], w.arms.candidate) is None  # recorded before the flag existed
    assert whatif.tactics_mode([], w.arms.candidate) is False and whatif.tactics_mode([], t.arms.candidate) is True


def test_a_server_inherits_only_what_it_needs_from_the_callers_environment(monkeypatch):
    """VLLM_API_KEY in the caller's shell made every server demand a key the client never sent
    (every request 401); a stray secret never reaches a server either."""
    monkeypatch.setenv("VLLM_API_KEY", "k-123")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s-456")
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "DEBUG")
    monkeypatch.setenv("OPENBLAS_CORETYPE", "Haswell")
    monkeypatch.setenv("PYTHONPATH", "/tmp/site")
    s = load_scenario(H200, backend="torch")
    env = ServerConfig("candidate", "m", "m", s.server, s.arms.candidate).env()
    assert "VLLM_API_KEY" not in env and "AWS_SECRET_ACCESS_KEY" not in env
    assert env["VLLM_LOGGING_LEVEL"] == "DEBUG" and env["OPENBLAS_CORETYPE"] == "Haswell"
    assert env["PYTHONPATH"] == "/tmp/site" and env["PATH"] and env["NCCL_NVLS_ENABLE"] == "0"
    monkeypatch.setenv("MY_KEY", "k-789")  # a scenario that asks for a key gets it, by name
    keyed = load_scenario(H200, backend="torch", overrides=["server.api_key_env=MY_KEY"])
    assert ServerConfig("candidate", "m", "m", keyed.server, keyed.arms.candidate).env()["VLLM_API_KEY"] == "k-789"
