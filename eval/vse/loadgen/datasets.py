"""Prompt sets: `random` with vLLM's semantics (exact input length after re-tokenization,
range ratio, shared prefix, seed), ShareGPT-format JSON, a JSONL of prompts, and a replayed
trace (its prompts built from the trace's block hashes, each due at its timestamp).

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
    # A replayed trace's request (None for the other kinds, and then not written to prompts.jsonl):
    arrival_s: float | None = None  # due this long after the run's start
    hash_ids: list[int] | None = None  # the trace's block hashes its text was built from
    block_len: int | None = None  # tokens per block: block j is tokens [j * block_len, (j + 1) * block_len)
    line: int | None = None  # its line in the trace file
    # A session's turn (kind sessions): the text is the user's turn; what is sent is every earlier
    # turn and answer, then it (loadgen/runner.py). arrival_s is then its session's start.
    session: int | None = None
    turn: int | None = None  # 0-based within its session
    think_s: float | None = None  # the user's think time before this turn


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


@lru_cache(maxsize=4)
def _words(tok: Tokenizer) -> np.ndarray:
    """Ids of tokens that are a space and ASCII letters and encode back to themselves: a pre-tokenizer
    splits at each such space, so blocks made of them keep their tokens when joined, and a prompt's
    tokens are its blocks' tokens end to end."""
    special = _special_ids(tok)
    cand = [i for i in range(tok.get_vocab_size()) if i not in special]
    texts = tok.decode_batch([[i] for i in cand])
    keep = [(i, t) for i, t in zip(cand, texts) if len(t) > 2 and t[0] == " " and t[1:].isascii() and t[1:].isalpha()]
    enc = tok.encode_batch([t for _, t in keep], add_special_tokens=False)
    ids = [i for (i, _), e in zip(keep, enc) if e.ids == [i]]
    if len(ids) < 100:
        raise SuiteError("tokenizer: fewer than 100 word tokens (a space and letters) to build trace blocks from")
    return np.asarray(ids)


# Warm-up requests are the window's first requests' lengths with blocks of their own: ids above
# any trace's, so that they warm the server without filling its prefix cache with the window's blocks.
WARMUP_BLOCKS = 1 << 48


def trace_prompts(spec: DatasetSpec, n: int, tok: Tokenizer, warmup: int = 0) -> list[Prompt]:
    """The window's first n - warmup requests, then warmup requests of their own blocks. A block's
    tokens are drawn from (seed, hash id) alone: equal hashes give equal blocks in every request
    (the prefix reuse the trace implies), different hashes different ones, and a run with another
    seed (every run k has its own) shares no block with this one."""
    from vse.scenario import trace

    win = trace.window(spec)
    words, block = _words(tok), win.block_len
    texts = dict(zip(words.tolist(), tok.decode_batch([[i] for i in words.tolist()])))
    cache: dict[int, list[str]] = {}

    def block_text(h: int, length: int) -> str:
        if h not in cache:
            cache[h] = [texts[i] for i in np.random.default_rng([spec.seed, h]).choice(words, size=block).tolist()]
        return "".join(cache[h][:length])

    measured = win.requests[: n - warmup]
    plan: list[tuple[trace.TraceRequest, list[int], float | None]] = [
        (r, list(r.hash_ids), r.arrival_s) for r in measured
    ]
    plan += [
        (r, [WARMUP_BLOCKS + i * 4096 + j for j in range(len(r.hash_ids))], None)
        for i, r in enumerate(win.requests[:warmup])
    ]
    prompts: list[Prompt] = []
    for i, (r, ids, arrival) in enumerate(plan):
        parts = [block_text(h, min(block, r.input_len - j * block)) for j, h in enumerate(ids)]
        prompts.append(Prompt(i, "".join(parts), r.input_len, r.output_len, arrival, ids, block, r.line))
    got = [len(e.ids) for e in tok.encode_batch([p.text for p in prompts], add_special_tokens=False)]
    if bad := next((p for p, g in zip(prompts, got) if g != p.prompt_len), None):
        raise SuiteError(
            f"tokenizer: a trace prompt of {bad.prompt_len} tokens (line {bad.line}) encodes to "
            f"{got[bad.index]}: its blocks' tokens merge where they join, so equal hashes would not be equal tokens"
        )
    return prompts


def session_prompts(spec: DatasetSpec, n: int, tok: Tokenizer, warmup: int = 0) -> list[Prompt]:
    """Every turn of every session (the plan: eval/vse/scenario/sessions.py), then `warmup` single
    prompts. A generated turn is random text of input_len tokens (+- range_ratio), its answer
    output_len; a file's turns are its own texts, their answers output_len."""
    from vse.scenario import sessions

    rng = np.random.default_rng(spec.seed)
    special = _special_ids(tok)
    allowed = np.array([i for i in range(tok.get_vocab_size()) if i not in special])

    def span(v: int) -> tuple[int, int]:
        return max(1, int(v * (1 - spec.range_ratio))), int(v * (1 + spec.range_ratio))

    (lo_in, hi_in), (lo_out, hi_out) = span(spec.input_len), span(spec.output_len)
    texts = sessions.conversations(spec.path, spec.conversation.count) if spec.path else None
    prompts: list[Prompt] = []
    for s_i, p in enumerate(sessions.plan(spec)):
        for t in range(p.turns):
            if texts is not None:
                text = texts[s_i][t]
                n_in = len(tok.encode(text, add_special_tokens=False).ids)
            else:
                target = int(rng.integers(lo_in, hi_in + 1))
                text, n_in = _exact_length_text(tok, rng.choice(allowed, size=target).tolist(), target, rng, allowed)
            n_out = int(rng.integers(lo_out, hi_out + 1)) if texts is None else spec.output_len
            think = p.think_s[t - 1] if t else None
            arrival = p.start_s if t == 0 else None
            prompts.append(Prompt(len(prompts), text, n_in, n_out, arrival, session=s_i, turn=t, think_s=think))
    if len(prompts) != n - warmup:
        raise SuiteError(f"workload.dataset: the sessions have {len(prompts)} turns, the run asked for {n - warmup}")
    one = spec.model_copy(update={"kind": DatasetKind.RANDOM, "path": None, "sessions": None})
    warm = random_prompts(one, warmup, tok) if warmup else []
    return prompts + [Prompt(len(prompts) + i, w.text, w.prompt_len, w.output_len) for i, w in enumerate(warm)]


_BUILDERS = {
    DatasetKind.RANDOM: random_prompts,
    DatasetKind.SHAREGPT: sharegpt_prompts,
    DatasetKind.JSONL: jsonl_prompts,
}


def build_prompts(spec: DatasetSpec, n: int, tokenizer_path: str, *, warmup: int = 0) -> list[Prompt]:
    """n prompts: the measured ones, then `warmup` more (a trace's warm-up has blocks of its own)."""
    tok = load_tokenizer(tokenizer_path)
    if spec.kind == DatasetKind.TRACE:  # the window is the prompt set: never cycled
        return trace_prompts(spec, n, tok, warmup)
    if spec.kind == DatasetKind.SESSIONS:  # every turn of every session, in session order
        return session_prompts(spec, n, tok, warmup)
    prompts = _BUILDERS[spec.kind](spec, n, tok)
    if not prompts:
        raise SuiteError(f"workload.dataset: {spec.kind.value} dataset gave no prompts")
    if len(prompts) < n:  # a small file: cycle it, as vLLM's samplers do
        prompts = [
            Prompt(i, p.text, p.prompt_len, p.output_len) for i, p in zip(range(n), (prompts * (n // len(prompts) + 1)))
        ]
    return prompts


OPTIONAL_FIELDS = ("arrival_s", "hash_ids", "block_len", "line", "session", "turn", "think_s")


def _row(p: Prompt) -> dict:
    """A prompt's line: a trace's or a session's fields only where it has them (other kinds' files
    stay as they were)."""
    return {k: v for k, v in asdict(p).items() if not (k in OPTIONAL_FIELDS and v is None)}


def save_prompts(path: Path, prompts: list[Prompt]) -> str:
    """Write prompts.jsonl; return its sha256, recorded so arms can be shown to match."""
    from vse.rundir.files import atomic_write_text

    text = "".join(json.dumps(_row(p), ensure_ascii=False) + "\n" for p in prompts)
    atomic_write_text(path, text)
    return hashlib.sha256(text.encode()).hexdigest()


def load_prompts(path: Path) -> list[Prompt]:
    with open(path) as f:
        return [Prompt(**json.loads(line)) for line in f if line.strip()]
