"""The FP8 GEMM backends an arm can ask vLLM for, and what each means to vLLM.

This module and process.py are the only places that know vLLM's command line.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass


class Backend(str, enum.Enum):
    """A closed set: scenario files and `make compare BACKEND=` accept exactly these."""

    AUTO = "auto"
    CUTLASS = "cutlass"
    FLASHINFER = "flashinfer"
    TORCH = "torch"
    # No FP8 selection at all: for arms that differ in something else (dtype, eager mode),
    # e.g. the CPU default, whose float model never reaches an FP8 linear kernel.
    NONE = "none"


@dataclass(frozen=True)
class BackendSpec:
    backend: Backend
    linear_backend_flag: str | None  # value of --linear-backend (vLLM >= 0.26)
    kernel_class: str | None  # what vLLM logs: "Selected <kernel_class> for Fp8LinearMethod"
    # Kernels to put in VLLM_DISABLED_KERNELS on vLLM < 0.26, which has no --linear-backend.
    disable_for_fallback: tuple[str, ...]
    min_compute_capability: tuple[int, int] | None
    why_min_cc: str = ""


CUTLASS_KERNEL = "CutlassFP8ScaledMMLinearKernel"
FLASHINFER_KERNEL = "FlashInferFP8ScaledMMLinearKernel"
TORCH_KERNEL = "PerTensorTorchFP8ScaledMMLinearKernel"
_ALL_FP8_KERNELS = (CUTLASS_KERNEL, FLASHINFER_KERNEL, TORCH_KERNEL)


def _others(kernel: str) -> tuple[str, ...]:
    return tuple(k for k in _ALL_FP8_KERNELS if k != kernel)


REGISTRY: dict[Backend, BackendSpec] = {
    Backend.AUTO: BackendSpec(Backend.AUTO, "auto", None, (), None),
    Backend.NONE: BackendSpec(Backend.NONE, None, None, (), None),
    Backend.CUTLASS: BackendSpec(
        Backend.CUTLASS,
        "cutlass",
        CUTLASS_KERNEL,
        _others(CUTLASS_KERNEL),
        (8, 9),
        "vLLM's CUTLASS FP8 scaled-mm needs compute capability 8.9+ (Ada, Hopper, Blackwell)",
    ),
    Backend.FLASHINFER: BackendSpec(
        Backend.FLASHINFER,
        "flashinfer_cutlass",
        FLASHINFER_KERNEL,
        _others(FLASHINFER_KERNEL),
        (10, 0),
        "vLLM's FlashInfer per-tensor FP8 GEMM (FlashInferFP8ScaledMMLinearKernel) needs compute "
        "capability 10.0+ (Blackwell)",
    ),
    Backend.TORCH: BackendSpec(
        Backend.TORCH,
        "torch",
        TORCH_KERNEL,
        _others(TORCH_KERNEL),
        (8, 9),
        "torch._scaled_mm FP8 needs compute capability 8.9+",
    ),
}

# The backends with an FP8 GEMM kernel of their own: what gemm-bench times.
FP8_KERNEL_BACKENDS = tuple(b for b, spec in REGISTRY.items() if spec.kernel_class)


def spec(backend: Backend) -> BackendSpec:
    return REGISTRY[backend]


def selection_args(backend: Backend, *, has_linear_backend_flag: bool = True) -> tuple[list[str], dict[str, str]]:
    """Command-line args and env vars that make vLLM pick this backend's kernel."""
    s = spec(backend)
    if s.linear_backend_flag is None:
        return [], {}
    if has_linear_backend_flag:
        return ["--linear-backend", s.linear_backend_flag], {}
    if s.disable_for_fallback:
        return [], {"VLLM_DISABLED_KERNELS": ",".join(s.disable_for_fallback)}
    return [], {}


_SELECTED_RE = re.compile(r"Selected (\w+) for (\w*Fp8\w*)")


def selected_kernels(log_text: str) -> dict[str, str]:
    """{linear method: kernel class} as vLLM logged them ("Selected X for Fp8LinearMethod")."""
    return {m.group(2): m.group(1) for m in _SELECTED_RE.finditer(log_text)}


def kernel_matches(backend: Backend, selected: str | None) -> bool:
    """True when the kernel vLLM selected is consistent with what the arm asked for."""
    want = spec(backend).kernel_class
    return want is None or selected == want


def describe_selected(by_method: dict[str, str]) -> str | None:
    """One kernel name when every FP8 linear method got the same one (the usual case), else each
    method's. vLLM's own fp8 checkpoints log Fp8LinearMethod; compressed-tensors ones their scheme."""
    kernels = set(by_method.values())
    if not kernels:
        return None
    if len(kernels) == 1:
        return kernels.pop()
    return ", ".join(f"{k} for {m}" for m, k in sorted(by_method.items()))
