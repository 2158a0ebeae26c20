from eval import backends
from eval.backends import Backend


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
