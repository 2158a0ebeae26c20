"""A vLLM general plugin for the suite's what-if arm: lets vLLM select FlashInfer's per-tensor FP8
GEMM (FlashInferFP8ScaledMMLinearKernel) on Hopper and Ada (compute capability 8.9-9.x), where
vLLM gates it to 10.0+. Not a configuration vLLM supports: the suite labels every such arm so.

It does nothing unless VSE_FLASHINFER_WHATIF=1 is set in the server's environment (the suite
sets it, and puts this package on the server's PYTHONPATH, only for an arm with `whatif: true`).
It refuses loudly when the vLLM it would patch lacks the class or method it expects."""

from __future__ import annotations

import inspect
import os

MODULE = "vllm.model_executor.kernels.linear.scaled_mm.flashinfer"
KERNEL = "FlashInferFP8ScaledMMLinearKernel"
MIN_CC = 89  # FlashInfer's bmm_fp8 runs from Ada/Hopper (its cuBLAS path)
VENDOR_MIN_CC = 100  # vLLM's own gate
ENV = "VSE_FLASHINFER_WHATIF"


class WhatIfError(RuntimeError):
    pass


def check(kernel_cls) -> None:
    """The version guard: the class must have is_supported as a classmethod taking
    compute_capability, as vLLM 0.26 has it."""
    fn = inspect.getattr_static(kernel_cls, "is_supported", None)
    if not isinstance(fn, classmethod):
        raise WhatIfError(
            f"vse-flashinfer-hopper: {KERNEL}.is_supported is not a classmethod in this vLLM; "
            "refusing to patch a kernel selection it does not understand"
        )
    if "compute_capability" not in inspect.signature(fn.__func__).parameters:
        raise WhatIfError(
            f"vse-flashinfer-hopper: {KERNEL}.is_supported takes no compute_capability in this vLLM; "
            "refusing to patch it"
        )


def patch(kernel_cls) -> None:
    check(kernel_cls)
    original = kernel_cls.is_supported.__func__

    def is_supported(cls, compute_capability: int | None = None):
        if compute_capability is not None and MIN_CC <= compute_capability < VENDOR_MIN_CC:
            # Every other condition (CUDA, FlashInfer installed) still as vLLM checks it.
            return original(cls, VENDOR_MIN_CC)
        return original(cls, compute_capability)

    is_supported.__vse_whatif__ = True
    kernel_cls.is_supported = classmethod(is_supported)


def register() -> None:
    """vLLM calls this in every process it starts (entry point group vllm.general_plugins)."""
    if os.environ.get(ENV) != "1":
        return
    import importlib

    try:
        mod = importlib.import_module(MODULE)
    except ImportError as e:
        raise WhatIfError(
            f"vse-flashinfer-hopper: this vLLM has no {MODULE} ({e}); the what-if arm needs vLLM 0.26's kernel layout"
        ) from e
    kernel_cls = getattr(mod, KERNEL, None)
    if kernel_cls is None:
        raise WhatIfError(f"vse-flashinfer-hopper: {MODULE} has no {KERNEL} in this vLLM")
    if not getattr(kernel_cls.is_supported, "__vse_whatif__", False):
        patch(kernel_cls)
    print(f"vse-flashinfer-hopper: what-if active: {KERNEL} allowed from compute capability {MIN_CC}", flush=True)
