"""Preflight decides in seconds, before any server starts."""

import os
from pathlib import Path

import pytest
from conftest import ROOT

from vse.errors import PreflightError
from vse.orchestration.scenario_check import load_scenario
from vse.server import preflight
from vse.server.preflight import Gpu

H200 = Gpu(0, "NVIDIA H200", (9, 0), 0, 143771)
B200 = Gpu(0, "NVIDIA B200", (10, 0), 0, 183359)


def scenario(name, backend=None):
    return load_scenario(ROOT / "scenarios" / name, backend=backend)


def test_flashinfer_refused_on_hopper_with_one_line():
    s = scenario("h200-llama3.1-8b-fp8-dummy.yaml", backend="flashinfer")
    with pytest.raises(PreflightError) as e:
        preflight.check_backends(s, [H200])
    msg = str(e.value)
    assert "needs compute capability 10.0+" in msg and "NVIDIA H200" in msg and "9.0 < 10.0" in msg
    assert "\n" not in msg


def test_cutlass_and_torch_pass_on_hopper_flashinfer_on_blackwell():
    preflight.check_backends(scenario("h200-llama3.1-8b-fp8-dummy.yaml", backend="torch"), [H200])
    preflight.check_backends(scenario("h200-llama3.1-8b-fp8-dummy.yaml", backend="flashinfer"), [B200])


def test_the_agreement_reference_is_checked_like_an_arm():
    s = load_scenario(
        ROOT / "scenarios" / "h200-llama3.1-8b-fp8-realistic.yaml",
        backend="torch",
        overrides=["agreement.reference.backend=flashinfer"],
    )
    with pytest.raises(PreflightError, match="^reference backend flashinfer: .* 9.0 < 10.0"):
        preflight.check_backends(s, [H200])


def test_no_gpu_is_named():
    with pytest.raises(PreflightError, match="no NVIDIA GPU is visible"):
        preflight.check_backends(scenario("h200-llama3.1-8b-fp8-dummy.yaml", backend="torch"), [])


@pytest.mark.parametrize("tp", [2, 4])
def test_tensor_parallel_needs_enough_gpus(tp):
    s = scenario(f"h200-llama3.3-70b-fp8-dummy-tp{tp}.yaml", backend="torch")
    assert s.server.tensor_parallel_size == tp
    with pytest.raises(PreflightError, match=f"server.tensor_parallel_size={tp} needs {tp} GPUs; 1 visible"):
        preflight.check_gpu_count(s, [H200])
    preflight.check_gpu_count(s, [Gpu(i, "NVIDIA H200", (9, 0), 0, 143771) for i in range(tp)])


def test_busy_gpus_do_not_count():
    s = scenario("h200-llama3.3-70b-fp8-dummy-tp2.yaml")
    gpus = [H200, Gpu(1, "NVIDIA H200", (9, 0), 80000, 143771)]
    with pytest.raises(PreflightError, match="needs 2 free GPUs; 1 of 2"):
        preflight.check_gpu_count(s, gpus)


def test_cpu_scenario_skips_gpu_checks():
    s = scenario("cpu-smoke.yaml")
    assert preflight.run(s) == []


def _second(tmp_path, *, gpus="None", tmpdir=None):
    """Another process taking the lock, as a second `make compare` would, with its own TMPDIR."""
    import subprocess
    import sys

    env = {**os.environ, "TMPDIR": str(tmpdir or tmp_path / "other-tmp")}
    Path(env["TMPDIR"]).mkdir(exist_ok=True)
    return subprocess.run(
        [sys.executable, "-c", f"from vse.server import lock; lock.acquire('second', {gpus})"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


def test_a_second_comparison_on_the_same_devices_is_refused_naming_the_first(tmp_path):
    """The lock lives where every job of the machine looks (VSE_LOCK_DIR here, /tmp by default),
    whatever the job's TMPDIR: a second CPU comparison with a TMPDIR of its own is refused."""
    from vse.server import lock

    held = lock.acquire("vse compare cpu-smoke, started 09:00:00")
    other = _second(tmp_path)
    assert other.returncode != 0 and "another comparison is running on this machine's devices" in other.stderr
    assert "vse compare cpu-smoke, started 09:00:00" in other.stderr
    assert _second(tmp_path, gpus="['GPU-aaa']").returncode != 0  # a CPU comparison holds the whole machine
    held.close()
    assert _second(tmp_path).returncode == 0


def test_gpu_comparisons_lock_their_gpus_by_uuid_and_share_the_machine(tmp_path):
    """8 agents on an 8-GPU host: comparisons on other GPUs run side by side; one GPU, however each
    process names it, is one comparison's; a CPU comparison waits for them all."""
    from vse.server import lock

    held = lock.acquire("on GPU-aaa", ["GPU-aaa"])
    assert _second(tmp_path, gpus="['GPU-bbb']").returncode == 0  # another GPU of the host
    other = _second(tmp_path, gpus="['GPU-bbb', 'GPU-aaa']")  # TP2 over the held GPU
    assert other.returncode != 0 and "on GPU-aaa" in other.stderr
    assert _second(tmp_path).returncode != 0  # a CPU comparison: the machine is in use
    held.close()
    assert _second(tmp_path, gpus="['GPU-aaa']").returncode == 0


def test_the_gpus_a_comparison_uses_are_those_cuda_visible_devices_names():
    gpus = [preflight.Gpu(i, "NVIDIA H100", (9, 0), 0, 81559, f"GPU-{i}{i}{i}") for i in range(4)]
    assert preflight.visible(gpus, None) == gpus
    assert [g.index for g in preflight.visible(gpus, "2")] == [2]
    assert [g.index for g in preflight.visible(gpus, "3,1")] == [3, 1]  # its order: vLLM's first GPU is 3
    assert [g.index for g in preflight.visible(gpus, "GPU-222,0")] == [2, 0]  # UUIDs (or their prefixes)
    assert preflight.visible(gpus, "") == [] and preflight.visible(gpus, "7,0") == []  # CUDA stops at a bad entry


def test_a_cpu_comparison_that_would_take_hours_is_said_before_it_starts():
    """A scenario without its own workload gets the seed PR's 384 prompts of 1,024 in / 128 out:
    on a CPU that is hours, said in one line before anything starts; the shipped smoke is not."""
    from vse.cli.compare import long_on_cpu
    from vse.orchestration.scenario_check import load_scenario

    assert long_on_cpu(load_scenario("scenarios/cpu-smoke.yaml")) is None
    seed = load_scenario(
        "scenarios/cpu-smoke.yaml", overrides=["workload.num_prompts=384", "workload.dataset.output_len=128"]
    )
    said = long_on_cpu(seed)
    assert said is not None and "h at 40 tok/s" in said and "BUDGET=" in said
    assert (
        long_on_cpu(
            load_scenario("scenarios/cpu-smoke.yaml", overrides=["workload.num_prompts=384", "run.budget_s=600"])
        )
        is None
    )


def test_a_server_variable_no_one_reads_is_refused_with_the_closest_name(tmp_path, monkeypatch):
    """VLLM_CPU_KVCACHE_SPACEx passed `check`: vLLM ignores a variable it does not read, and the run
    measures another configuration than the scenario says. The names come from the arm's vLLM's own
    source (found without importing it); VSE_* from the suite's."""
    pkg = tmp_path / "site" / "vllm"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise ImportError('importing vLLM is not needed')\n")
    (pkg / "envs.py").write_text('environment_variables = {"VLLM_CPU_KVCACHE_SPACE": int, "VLLM_LOGGING_LEVEL": str}\n')
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "site"))
    import sys

    base = ["server.device=cpu", f"server.vllm.python={sys.executable}"]
    ok = load_scenario(
        ROOT / "scenarios" / "cpu-smoke.yaml", overrides=[*base, "server.env={VLLM_CPU_KVCACHE_SPACE: '4'}"]
    )
    preflight.check_env_names(ok)
    typo = load_scenario(
        ROOT / "scenarios" / "cpu-smoke.yaml", overrides=[*base, "server.env={VLLM_CPU_KVCACHE_SPACEx: '4'}"]
    )
    with pytest.raises(
        PreflightError, match="VLLM_CPU_KVCACHE_SPACEx: no such variable.*did you mean VLLM_CPU_KVCACHE_SPACE"
    ):
        preflight.check_env_names(typo)
    mine = load_scenario(
        ROOT / "scenarios" / "cpu-smoke.yaml", overrides=[*base, "arms.candidate.env={VSE_PLANTED_SLOWDWN: '1'}"]
    )
    with pytest.raises(
        PreflightError, match="candidate: server env VSE_PLANTED_SLOWDWN.*the suite.*VSE_PLANTED_SLOWDOWN"
    ):
        preflight.check_env_names(mine)
