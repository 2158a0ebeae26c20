"""The FP8 linear GEMMs a served model runs, from its config.json: (K, N) of every projection
per tensor-parallel rank, and the token counts M the server really multiplies them at (decode
batches up to max_num_seqs, prefill chunks up to max_num_batched_tokens). Pure.

Llama layout as vLLM builds it: fused QKV (column-parallel), O (row-parallel), fused gate-up
(column-parallel, merged), down (row-parallel). Each rank holds 1/tp of every projection."""

from __future__ import annotations

from dataclasses import asdict, dataclass

# vLLM's defaults when a scenario sets neither (V1 engine, online serving on a GPU).
DEFAULT_MAX_NUM_SEQS = 256
DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192


@dataclass(frozen=True)
class GemmShape:
    name: str  # qkv, o, gate_up, down
    k: int  # input features (reduction)
    n: int  # output features
    per_layer: int = 1  # how many of this GEMM a decoder layer runs

    def flops(self, m: int) -> float:
        return 2.0 * m * self.k * self.n

    def to_json(self) -> dict:
        return asdict(self)


class ShapeError(ValueError):
    pass


def llama_shapes(cfg: dict, tp: int = 1) -> list[GemmShape]:
    """The four FP8 GEMMs of a Llama decoder layer on one of tp ranks."""
    if cfg.get("model_type") not in ("llama", None) and "LlamaForCausalLM" not in cfg.get("architectures", []):
        raise ShapeError(f"no GEMM layout known for model_type {cfg.get('model_type')!r} (Llama only)")
    h, inter = cfg["hidden_size"], cfg["intermediate_size"]
    heads, kv = cfg["num_attention_heads"], cfg.get("num_key_value_heads", cfg["num_attention_heads"])
    hd = cfg.get("head_dim") or h // heads
    if heads % tp or inter % tp:
        raise ShapeError(f"tensor parallel {tp} does not divide {heads} heads / intermediate size {inter}")
    # KV heads are replicated when tp exceeds them (vLLM: max(1, kv // tp) per rank).
    kv_rank = max(1, kv // tp)
    return [
        GemmShape("qkv", h, (heads // tp + 2 * kv_rank) * hd),
        GemmShape("o", heads // tp * hd, h),
        GemmShape("gate_up", h, 2 * inter // tp),
        GemmShape("down", inter // tp, h),
    ]


def token_counts(max_num_seqs: int | None, max_num_batched_tokens: int | None) -> list[int]:
    """M values: powers of two (and the limits themselves) for decode up to max_num_seqs and for
    prefill chunks up to max_num_batched_tokens."""
    seqs = max_num_seqs or DEFAULT_MAX_NUM_SEQS
    tokens = max_num_batched_tokens or DEFAULT_MAX_NUM_BATCHED_TOKENS
    ms, m = set(), 1
    while m <= tokens:
        ms.add(m)
        m *= 2
    ms.update({seqs, tokens})
    return sorted(x for x in ms if x <= tokens)


def decode_or_prefill(m: int, max_num_seqs: int | None) -> str:
    return "decode" if m <= (max_num_seqs or DEFAULT_MAX_NUM_SEQS) else "prefill"
