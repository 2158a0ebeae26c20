"""Times FP8 GEMMs on a GPU. Runs in the vLLM environment (it needs torch, vLLM, FlashInfer),
as a script, with no import from the suite:

    python eval/vse/gemm/timing.py PLAN.json OUT.json

PLAN: {"shapes": [{"name", "k", "n"}], "ms": [...], "backends": [...], "ceiling_sizes": [...]}.
Per (backend, shape, M): fresh random FP8 inputs with per-tensor scales (never zeros), the
output checked against a float32 reference before timing, then a CUDA graph of `calls` GEMMs
replayed `replays` times and timed with CUDA events; the median per call is reported. Weights
rotate over enough copies to exceed the L2 cache, as in a server where every layer's weights
stream from HBM. Activation quantization is not timed (it is the same for every backend).

Backends are the ops vLLM's per-tensor FP8 linear kernels call: cutlass = vllm._custom_ops.
cutlass_scaled_mm (CutlassFP8ScaledMMLinearKernel), torch = torch._scaled_mm (the torch
kernel), flashinfer = flashinfer.bmm_fp8 with its cuBLAS backend (what runs on SM90; vLLM's
FlashInfer per-tensor kernel is SM100+)."""

from __future__ import annotations

import importlib
import json
import math
import os
import statistics
import sys
import time

# Run as a script, Python puts the script's own folder first on sys.path, where the suite's modules (metrics.py,
# models.py, ...) could shadow other top-level modules that vLLM imports.
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]
import torch  # noqa: E402

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
L2_BYTES = 256 * 2**20  # rotate weights over at least this much memory (H200 L2: 50 MB)


def quant(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    scale = (x.abs().max().float() / FP8_MAX).reshape(1)
    return (x / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale


def backend_fn(name: str):
    if name == "torch":
        return lambda a, b, sa, sb: torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)
    if name == "cutlass":
        from vllm import _custom_ops as ops

        return lambda a, b, sa, sb: ops.cutlass_scaled_mm(a, b, sa, sb, torch.bfloat16)
    if name == "flashinfer":
        import flashinfer

        return lambda a, b, sa, sb: flashinfer.bmm_fp8(
            a.unsqueeze(0), b.unsqueeze(0), sa, sb, torch.bfloat16, backend="cublas"
        ).squeeze(0)
    raise ValueError(f"unknown backend {name}")


def time_one(fn, m: int, k: int, n: int, calls: int, replays: int) -> dict:
    g = torch.Generator(device="cuda").manual_seed(m * 7919 + k * 31 + n)
    a, sa = quant(torch.randn(m, k, device="cuda", generator=g))
    copies = max(1, min(calls, math.ceil(L2_BYTES / (n * k))))
    ws = [quant(torch.randn(n, k, device="cuda", generator=g) * 0.02) for _ in range(copies)]
    # (K, N) column-major: the layout vLLM keeps FP8 weights in for these kernels.
    bs = [(w.t(), s) for w, s in ws]
    out = fn(a, bs[0][0], sa, bs[0][1]).float()
    ref = (a.float() * sa) @ (ws[0][0].float() * ws[0][1]).t()
    err = float((out - ref).abs().max() / ref.abs().max().clamp_min(1e-12))
    if not math.isfinite(err) or err > 0.02:
        return {"error": f"output differs from the float32 reference (max rel error {err:.3g})"}
    for _ in range(3):
        fn(a, bs[0][0], sa, bs[0][1])
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        fn(a, bs[0][0], sa, bs[0][1])  # warm-up on the capture stream
        torch.cuda.synchronize()
        with torch.cuda.graph(graph, stream=stream):
            for i in range(calls):
                fn(a, bs[i % copies][0], sa, bs[i % copies][1])
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        graph.replay()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) * 1000 / calls)  # us per GEMM
    us = statistics.median(times)
    return {
        "us": us,
        "us_p10": sorted(times)[len(times) // 10],
        "us_p90": sorted(times)[9 * len(times) // 10],
        "tflops": 2 * m * k * n / (us * 1e-6) / 1e12,
        "max_rel_error": err,
        "weight_copies": copies,
    }


def main(plan_path: str, out_path: str) -> int:
    with open(plan_path) as f:
        plan = json.load(f)
    if not torch.cuda.is_available():
        print("gemm-bench: no CUDA GPU visible to this Python: nothing to time", file=sys.stderr)
        return 4
    calls, replays = plan.get("calls", 10), plan.get("replays", 100)
    res = {
        "gpu": torch.cuda.get_device_name(),
        "capability": list(torch.cuda.get_device_capability()),
        "torch": torch.__version__,
        "versions": {},
        "results": [],
        "errors": {},
        "ceiling": [],
    }
    for mod in ("vllm", "flashinfer"):
        try:
            res["versions"][mod] = importlib.import_module(mod).__version__  # vLLM's Python, not the suite's
        except Exception as e:
            res["versions"][mod] = f"unavailable: {type(e).__name__}"
    fns = {}
    for b in plan["backends"]:
        try:
            fns[b] = backend_fn(b)
        except Exception as e:
            res["errors"][b] = f"{type(e).__name__}: {e}"
    t0 = time.monotonic()
    for b, fn in fns.items():
        for sh in plan["shapes"]:
            for m in plan["ms"]:
                try:
                    r = time_one(fn, m, sh["k"], sh["n"], calls, replays)
                except Exception as e:
                    r = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"}
                res["results"].append({"backend": b, "shape": sh["name"], "k": sh["k"], "n": sh["n"], "m": m, **r})
            print(f"gemm-bench: {b} {sh['name']} done at {time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)
    # The GPU's own FP8 matrix rate: the best any backend reaches on large square GEMMs.
    for size in plan.get("ceiling_sizes", [8192, 16384]):
        for b, fn in fns.items():
            r = time_one(fn, size, size, size, calls=4, replays=30)
            res["ceiling"].append({"backend": b, "size": size, **r})
    res["seconds"] = time.monotonic() - t0
    with open(out_path, "w") as f:
        json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
