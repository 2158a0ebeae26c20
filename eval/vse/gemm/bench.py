"""make gemm-bench: the model's FP8 GEMM shapes (from its config.json), timed on this machine's
GPU in the vLLM environment (eval/vse/gemm/timing.py), written as gemm.json plus gemm.md and
gemm.html. Refuses in one line where there is no NVIDIA GPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from vse.backends import FP8_KERNEL_BACKENDS
from vse.errors import SuiteError, UnsupportedError
from vse.exitcodes import ExitCode
from vse.gemm import shapes as gemm_shapes
from vse.models import sources
from vse.rundir.files import write_json
from vse.rundir.layout import GemmDir
from vse.scenario import Scenario
from vse.server import preflight

BACKENDS = tuple(b.value for b in FP8_KERNEL_BACKENDS)  # timing.py runs them by these names
TIMING_SCRIPT = Path(__file__).with_name("timing.py")  # run in vLLM's Python, not imported


def model_config(s: Scenario) -> dict:
    cfg = sources.model_config(s.model)
    if cfg is None:
        raise SuiteError(
            f"gemm-bench: {s.model.id}: no config.json (a hub id is not downloaded; give a local directory)"
        )
    return cfg


def plan(s: Scenario, backends: tuple[str, ...] = BACKENDS) -> dict:
    shapes = gemm_shapes.llama_shapes(model_config(s), s.server.tensor_parallel_size)
    return {
        "shapes": [x.to_json() for x in shapes],
        "ms": gemm_shapes.token_counts(s.server.max_num_seqs, s.server.max_num_batched_tokens),
        "backends": list(backends),
        "ceiling_sizes": [8192, 16384],
        "calls": 10,
        "replays": 100,
    }


def run(s: Scenario, out: Path, backends: tuple[str, ...] = BACKENDS, timeout_s: float = 900) -> dict:
    gpus = preflight.query_gpus()
    if not gpus:
        raise UnsupportedError("gemm-bench needs an NVIDIA GPU: nvidia-smi finds none on this machine")
    out.mkdir(parents=True, exist_ok=True)
    p = plan(s, backends)
    d = GemmDir(out)
    write_json(d.plan, p)
    python = (s.arms.baseline.vllm or s.server.vllm).python or sys.executable
    try:
        proc = subprocess.run(
            [python, str(TIMING_SCRIPT), str(d.plan), str(d.result)],
            stderr=subprocess.PIPE,
            text=True,
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired:
        raise SuiteError(f"gemm-bench: the timing script ran over {timeout_s:.0f} s and was stopped") from None
    d.log.write_text(proc.stderr)
    if proc.returncode == ExitCode.UNSUPPORTED:  # the script says so with the suite's code
        raise UnsupportedError(proc.stderr.strip().splitlines()[-1])
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise SuiteError(f"gemm-bench: the timing script failed (exit {proc.returncode}): {last} (log: {d.log})")
    res = json.loads(d.result.read_text())
    return res
