"""Prompt sets: `random` with vLLM's semantics (exact input length after re-tokenization,
range ratio, shared prefix, seed), ShareGPT-format JSON, and a JSONL of prompts.

The same spec and seed give byte-identical prompts, so both arms see the same requests; the
prompts used are saved with the run (prompts.jsonl)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from vse.errors import SuiteError
from vse.scenario import DatasetKind, DatasetSpec


@dataclass(frozen=True)
class Prompt:
    index: int
    text: str
    prompt_len: int  # tokens, by the model's tokenizer, without special tokens (vLLM's count)
    output_len: int  # max_tokens asked for


@lru_cache(maxsize=8)
def load_tokenizer(path: str) -> Tokenizer:
    """The model's tokenizer from a local tokenizer.json; a hub id is fetched where a hub is reachable."""
    p = Path(path)
    if p.is_dir():
        p = p / "tokenizer.json"
    if p.is_file():
        return Tokenizer.from_file(str(p))
    try:
        return Tokenizer.from_pretrained(path)
    except Exception as e:  # no hub here: say which file is missing
        raise SuiteError(f"tokenizer: no tokenizer.json at {path} and the hub gave none ({type(e).__name__})") from None


def _special_ids(tok: Tokenizer) -> set[int]:
    return {t.id if hasattr(t, "id") else i for i, t in tok.get_added_tokens_decoder().items()}


def _exact_length_text(
    tok: Tokenizer, ids: list[int], target: int, rng: np.random.Generator, allowed: np.ndarray
) -> tuple[str, int]:
    """Decode random ids and re-encode until the text is exactly `target` tokens long: decoding
    can merge or split tokens, and the server counts the text, not our ids."""
    text = tok.decode(ids)
    for _ in range(20):
        enc = tok.encode(text, add_special_tokens=False).ids
        if len(enc) == target:
            return text, target
        if len(enc) > target:
            enc = enc[:target]
        else:
            enc = enc + rng.choice(allowed, size=target - len(enc)).tolist()
        text = tok.decode(enc)
    n = len(tok.encode(text, add_special_tokens=False).ids)
    return text, n


def random_prompts(spec: DatasetSpec, n: int, tok: Tokenizer) -> list[Prompt]:
    rng = np.random.default_rng(spec.seed)
    special = _special_ids(tok)
    allowed = np.array([i for i in range(tok.get_vocab_size()) if i not in special])
    lo_in, hi_in = int(spec.input_len * (1 - spec.range_ratio)), int(spec.input_len * (1 + spec.range_ratio))
    lo_out, hi_out = int(spec.output_len * (1 - spec.range_ratio)), int(spec.output_len * (1 + spec.range_ratio))
    in_lens = rng.integers(max(lo_in, 1), hi_in + 1, size=n)
    out_lens = rng.integers(max(lo_out, 1), hi_out + 1, size=n)
    prefix = rng.choice(allowed, size=spec.prefix_len).tolist() if spec.prefix_len else []
    prompts = []
    for i in range(n):
        target = spec.prefix_len + int(in_lens[i])
        ids = prefix + rng.choice(allowed, size=int(in_lens[i])).tolist()
        text, length = _exact_length_text(tok, ids, target, rng, allowed)
        prompts.append(Prompt(i, text, length, int(out_lens[i])))
    return prompts


def _path(spec: DatasetSpec) -> str:
    if not spec.path:
        raise ValueError(f"workload.dataset.kind {spec.kind.value} needs workload.dataset.path")
    return spec.path


def sharegpt_prompts(spec: DatasetSpec, n: int, tok: Tokenizer) -> list[Prompt]:
    """First human turn as prompt, the reply's token count as output length (vLLM's filters:
    prompt and reply >= 4 tokens, prompt <= 1024, prompt + reply <= 2048)."""
    data = json.loads(Path(_path(spec)).read_text())
    rng = np.random.default_rng(spec.seed)
    order = rng.permutation(len(data))
    prompts: list[Prompt] = []
    for j in order:
        conv = data[j].get("conversations") or data[j].get("conversation") or []
        if len(conv) < 2:
            continue
        text, reply = conv[0].get("value", ""), conv[1].get("value", "")
        p_len = len(tok.encode(text, add_special_tokens=False).ids)
        o_len = len(tok.encode(reply, add_special_tokens=False).ids)
        if p_len < 4 or o_len < 4 or p_len > 1024 or p_len + o_len > 2048:
            continue
        prompts.append(Prompt(len(prompts), text, p_len, o_len))
        if len(prompts) == n:
            break
    return prompts


def jsonl_prompts(spec: DatasetSpec, n: int, tok: Tokenizer) -> list[Prompt]:
    prompts: list[Prompt] = []
    with open(_path(spec)) as f:
        for line in f:
            if not line.strip():
                continue
            row = json.loads(line)
            text = row["prompt"]
            p_len = len(tok.encode(text, add_special_tokens=False).ids)
            prompts.append(Prompt(len(prompts), text, p_len, int(row.get("output_len", spec.output_len))))
            if len(prompts) == n:
                break
    return prompts


_BUILDERS = {
    DatasetKind.RANDOM: random_prompts,
    DatasetKind.SHAREGPT: sharegpt_prompts,
    DatasetKind.JSONL: jsonl_prompts,
}


def build_prompts(spec: DatasetSpec, n: int, tokenizer_path: str) -> list[Prompt]:
    tok = load_tokenizer(tokenizer_path)
    prompts = _BUILDERS[spec.kind](spec, n, tok)
    if not prompts:
        raise SuiteError(f"workload.dataset: {spec.kind.value} dataset gave no prompts")
    if len(prompts) < n:  # a small file: cycle it, as vLLM's samplers do
        prompts = [
            Prompt(i, p.text, p.prompt_len, p.output_len) for i, p in zip(range(n), (prompts * (n // len(prompts) + 1)))
        ]
    return prompts


def save_prompts(path: Path, prompts: list[Prompt]) -> str:
    """Write prompts.jsonl; return its sha256, recorded so arms can be shown to match."""
    from vse.rundir.files import atomic_write_text

    text = "".join(json.dumps(asdict(p), ensure_ascii=False) + "\n" for p in prompts)
    atomic_write_text(path, text)
    return hashlib.sha256(text.encode()).hexdigest()


def load_prompts(path: Path) -> list[Prompt]:
    with open(path) as f:
        return [Prompt(**json.loads(line)) for line in f if line.strip()]
