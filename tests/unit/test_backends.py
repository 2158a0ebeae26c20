from vse import backends
from vse.backends import Backend


def test_every_backend_is_registered():
    assert set(backends.REGISTRY) == set(Backend)
    for required in ("cutlass", "flashinfer", "torch", "auto"):
        assert Backend(required) in backends.REGISTRY


def test_selection_flags_for_vllm_026_and_later():
    assert backends.selection_args(Backend.FLASHINFER) == (["--linear-backend", "flashinfer_cutlass"], {})
    assert backends.selection_args(Backend.CUTLASS) == (["--linear-backend", "cutlass"], {})
    assert backends.selection_args(Backend.TORCH) == (["--linear-backend", "torch"], {})
    assert backends.selection_args(Backend.NONE) == ([], {})


def test_fallback_disables_the_other_kernels():
    args, env = backends.selection_args(Backend.TORCH, has_linear_backend_flag=False)
    assert args == []
    assert set(env["VLLM_DISABLED_KERNELS"].split(",")) == {backends.CUTLASS_KERNEL, backends.FLASHINFER_KERNEL}


def test_min_compute_capability():
    assert backends.spec(Backend.FLASHINFER).min_compute_capability == (10, 0)
    assert backends.spec(Backend.CUTLASS).min_compute_capability <= (9, 0)
    assert backends.spec(Backend.TORCH).min_compute_capability <= (9, 0)


LOG = """(EngineCore pid=1) INFO 12-02 10:00:01 [__init__.py:759] Selected CutlassFP8ScaledMMLinearKernel for Fp8LinearMethod
(EngineCore pid=1) INFO 12-02 10:00:01 [__init__.py:798] Selected CutlassFp8BlockScaledMMKernel for Fp8BlockLinearMethod
"""


def test_kernel_from_log():
    sel = backends.selected_kernels(LOG)
    assert sel["Fp8LinearMethod"] == "CutlassFP8ScaledMMLinearKernel"
    assert backends.kernel_matches(Backend.CUTLASS, sel["Fp8LinearMethod"])
    assert not backends.kernel_matches(Backend.FLASHINFER, sel["Fp8LinearMethod"])
    assert not backends.kernel_matches(Backend.TORCH, None)
    assert backends.kernel_matches(Backend.AUTO, None) and backends.kernel_matches(Backend.NONE, None)


def test_every_fp8_linear_method_is_checked():
    """A compressed-tensors FP8 checkpoint logs its scheme class, not Fp8LinearMethod."""
    from vse.backends import describe_selected, selected_kernels

    log = (
        "INFO Selected CutlassFP8ScaledMMLinearKernel for CompressedTensorsW8A8Fp8\n"
        "INFO Selected PerTensorTorchFP8ScaledMMLinearKernel for Fp8LinearMethod\n"
    )
    by = selected_kernels(log)
    assert by == {
        "CompressedTensorsW8A8Fp8": "CutlassFP8ScaledMMLinearKernel",
        "Fp8LinearMethod": "PerTensorTorchFP8ScaledMMLinearKernel",
    }
    assert "for CompressedTensorsW8A8Fp8" in describe_selected(by)
    assert (
        describe_selected({"CompressedTensorsW8A8Fp8": "CutlassFP8ScaledMMLinearKernel"})
        == "CutlassFP8ScaledMMLinearKernel"
    )


def test_a_compressed_tensors_log_passes_the_kernel_check_and_a_mixed_one_fails(tmp_path):
    import pytest

    from vse.errors import KernelMismatchError
    from vse.scenario import ArmSpec, ServerSpec
    from vse.server.process import ServerConfig, VllmServer

    cfg = ServerConfig(
        arm="candidate",
        model="m",
        served_name="m",
        server=ServerSpec(),
        spec=ArmSpec(label="c", backend=Backend.CUTLASS),
    )
    log = tmp_path / "s.log"
    srv = VllmServer(cfg, log)
    log.write_text("$ vllm serve\nINFO Selected CutlassFP8ScaledMMLinearKernel for CompressedTensorsW8A8Fp8\n")
    assert srv.check_kernel() == "CutlassFP8ScaledMMLinearKernel"
    log.write_text(log.read_text() + "INFO Selected PerTensorTorchFP8ScaledMMLinearKernel for Fp8LinearMethod\n")
    with pytest.raises(KernelMismatchError, match="PerTensorTorchFP8ScaledMMLinearKernel for Fp8LinearMethod"):
        srv.check_kernel()


def test_a_log_level_that_hides_the_kernel_line_is_refused_before_start():
    import pytest

    from vse.errors import PreflightError
    from vse.orchestration.scenario_check import load_scenario
    from vse.server import preflight

    s = load_scenario("scenarios/h200-llama3.1-8b-fp8-dummy.yaml")
    preflight.check_log_level(s, {})
    with pytest.raises(PreflightError, match="VLLM_LOGGING_LEVEL=WARNING .*the environment"):
        preflight.check_log_level(s, {"VLLM_LOGGING_LEVEL": "WARNING"})
    quiet = load_scenario(
        "scenarios/h200-llama3.1-8b-fp8-dummy.yaml", overrides=["server.env={VLLM_LOGGING_LEVEL: ERROR}"]
    )
    with pytest.raises(PreflightError, match="from server.env"):
        preflight.check_log_level(quiet, {})
    cpu = load_scenario("scenarios/cpu-smoke.yaml")  # no FP8 kernel to check: any level is fine
    preflight.check_log_level(cpu, {"VLLM_LOGGING_LEVEL": "ERROR"})
