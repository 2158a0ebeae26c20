"""Realistic random-weights checkpoints: where they are cached, building one once through
checkpoint_writer.py in vLLM's Python (it needs torch), and planting a known fault for one arm."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path

from vse.errors import PreflightError
from vse.scenario import GeneratedModel, PlantedFault

WRITER = Path(__file__).with_name("checkpoint_writer.py")


def cache_dir(gen: GeneratedModel, cache: Path) -> Path:
    """One directory per architecture, std, seed and writer version: a changed writer rebuilds."""
    version = hashlib.sha256(WRITER.read_bytes()).hexdigest()[:8]
    return (
        cache
        / "models"
        / "generated"
        / (f"{gen.architecture.value}-{gen.quantization}-std{gen.weight_std:g}-seed{gen.seed}-w{version}")
    )


def info(model_dir: Path) -> dict:
    return json.loads((model_dir / "vse_checkpoint.json").read_text())


def ensure(gen: GeneratedModel, config_dir: Path, cache: Path, python: str, device: str, log=print) -> Path:
    """The cached checkpoint for GEN, written once (config and tokenizer from CONFIG_DIR)."""
    out = cache_dir(gen, cache)
    if (out / ".complete").is_file():
        return out
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(config_dir, out)
    log(
        f"writing a {gen.architecture.value} checkpoint with random weights (normal, std {gen.weight_std:g}), "
        f"FP8 static scales calibrated on a few prompts, on {device}: {out}"
    )
    r = subprocess.run(
        [
            python,
            str(WRITER),
            "build",
            str(out),
            "--std",
            str(gen.weight_std),
            "--seed",
            str(gen.seed),
            "--device",
            device,
        ],
        capture_output=True,
        text=True,
    )
    if r.returncode != 0:
        shutil.rmtree(out, ignore_errors=True)
        raise PreflightError(f"writing the realistic checkpoint failed (exit {r.returncode}): {_last_line(r)}")
    (out / ".complete").write_text(r.stdout)
    return out


def describe(model_dir: Path) -> str:
    i = info(model_dir)
    scales = f"; FP8 static scales calibrated on {i['calibration_tokens']} tokens" if i.get("fp8") else ""
    return (
        f"realistic random weights (normal, std {i['std']:g}{scales}): next-token entropy {i['next_token_entropy_nats']:.2f} nats "
        f"(uniform {i['uniform_entropy_nats']:.2f})"
    )


def plant(src: Path, dst: Path, fault: PlantedFault, python: str) -> dict:
    """DST: SRC with one weight scale (or weight) off by fault.factor; other shards linked."""
    if (dst / "vse_fault.json").is_file():
        return json.loads((dst / "vse_fault.json").read_text())
    r = subprocess.run(
        [
            python,
            str(WRITER),
            "plant",
            str(src),
            str(dst),
            "--layer",
            str(fault.layer),
            "--proj",
            fault.proj,
            "--factor",
            str(fault.factor),
        ],
        capture_output=True,
        text=True,
    )
    if r.returncode != 0:
        raise PreflightError(f"planting the fault failed: {_last_line(r)}")
    return json.loads(r.stdout)


def _last_line(r: subprocess.CompletedProcess) -> str:
    """The writer's one-line reason: its last line of stderr (or stdout)."""
    return ((r.stderr or r.stdout).strip().splitlines() or ["no output"])[-1]
