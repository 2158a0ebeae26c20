"""Preflight decides in seconds, before any server starts."""

import pytest
from conftest import ROOT

from vse.errors import PreflightError
from vse.scenario_load import load_scenario
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


def test_a_second_comparison_on_the_same_devices_is_refused_naming_the_first(tmp_path, monkeypatch):
    import subprocess
    import sys

    from vse.server import lock

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", None)
    held = lock.acquire("vse compare cpu-smoke, started 09:00:00")
    other = subprocess.run(  # another process, as a second `make compare` would be
        [sys.executable, "-c", "from vse.server import lock; lock.acquire('second')"],
        capture_output=True,
        text=True,
        env={**__import__("os").environ, "TMPDIR": str(tmp_path)},
        timeout=60,
    )
    assert other.returncode != 0 and "another comparison is running on this machine's devices" in other.stderr
    assert "vse compare cpu-smoke, started 09:00:00" in other.stderr
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")  # other GPUs of the same host: its own lock
    lock.acquire("on GPU 1").close()
    held.close()
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    lock.acquire("after the first ended").close()


def test_a_cpu_comparison_that_would_take_hours_is_said_before_it_starts():
    """A scenario without its own workload gets the seed PR's 384 prompts of 1,024 in / 128 out:
    on a CPU that is hours, said in one line before anything starts; the shipped smoke is not."""
    from vse.cli_compare import long_on_cpu
    from vse.scenario_load import load_scenario

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
