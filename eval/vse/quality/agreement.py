"""Cross-arm output agreement: the same prompts, greedy, with top-k logprobs, on both arms'
servers. A numerically broken GEMM shows up here even where accuracy cannot be measured
(a small model on CPU, random weights on GPU). This module compares what was recorded (pure);
agreement_probe.py collects it from a live server."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from vse.scenario import AgreementSpec

# Built-in prompts: short, varied, and with a clear greedy continuation for real models.
BUILTIN_PROMPTS = [
    "The capital of France is",
    "Water boils at a temperature of",
    "The largest planet in our solar system is",
    "def fibonacci(n):\n",
    "Once upon a time, in a small village,",
    "The chemical symbol for gold is",
    "1, 2, 3, 4, 5,",
    "To make a cup of tea, first",
    "The theory of relativity was developed by",
    "SELECT name FROM users WHERE",
    "The three primary colors are",
    "In machine learning, a neural network is",
    "The quick brown fox",
    "Photosynthesis is the process by which",
    "The first president of the United States was",
    "import numpy as np\nx = np.",
    "A haiku about the sea:\n",
    "The speed of light is approximately",
    "Translate to French: Good morning ->",
    "The square root of 144 is",
]


@dataclass
class Completion:
    prompt: str
    text: str = ""
    tokens: list[str] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[dict[str, float]] = field(default_factory=list)
    error: str = ""


def prompts_for(spec: AgreementSpec) -> list[str]:
    if spec.prompts_path:
        with open(spec.prompts_path) as f:
            rows = [json.loads(line)["prompt"] for line in f if line.strip()]
    else:
        rows = BUILTIN_PROMPTS
    return [rows[i % len(rows)] for i in range(spec.num_prompts)]


def load(path: Path) -> list[Completion] | None:
    if not path.is_file():
        return None
    with open(path) as f:
        return [Completion(**json.loads(line)) for line in f if line.strip()]


def degenerate(comps: list[Completion]) -> str:
    """Why these outputs cannot show a numerical difference, or "" when they can. vLLM's dummy
    weights give a flat next-token distribution (every logprob near -log(vocab size)) and
    outputs that cycle through one or two tokens; two arms then agree 100% whatever their GEMMs
    compute (docs/gpu.md, "The stand-in model")."""
    ok = [c for c in comps if not c.error and c.tokens]
    if not ok:
        return "no output tokens"
    spreads = [max(t.values()) - min(t.values()) for c in ok for t in c.top_logprobs if len(t) >= 2]
    if spreads and max(spreads) < 1e-3:
        return "the next-token distribution is flat (top logprobs within 0.001 of each other): random weights"
    lps = np.array([x for c in ok for x in c.logprobs if np.isfinite(x)])
    if len(lps) > 1 and np.ptp(lps) < 1e-4:
        return f"every chosen token has the same logprob ({lps[0]:.4f}): outputs are degenerate"
    long_ = [c for c in ok if len(c.tokens) >= 8]
    if long_ and all(len(set(c.tokens)) <= 2 for c in long_):
        return "every output cycles through one or two tokens"
    return ""


def compare(base: list[Completion], cand: list[Completion]) -> dict[str, Any]:
    """Exact-match rate of whole outputs, first divergence position, and |logprob difference|
    of the chosen tokens while the two outputs still agree."""
    pairs = [(b, c) for b, c in zip(base, cand) if not b.error and not c.error]
    if not pairs:
        return {"prompts": 0, "errors": len(base)}
    exact, first_div, diffs = 0, [], []
    for b, c in pairs:
        n = min(len(b.tokens), len(c.tokens))
        div = next((i for i in range(n) if b.tokens[i] != c.tokens[i]), n)
        if b.text == c.text:
            exact += 1
        else:
            first_div.append(div)
        diffs += [
            abs(b.logprobs[i] - c.logprobs[i])
            for i in range(div)
            if np.isfinite(b.logprobs[i]) and np.isfinite(c.logprobs[i])
        ]
    d = np.asarray(diffs or [0.0])
    return {
        "degenerate": degenerate(base + cand),
        "prompts": len(pairs),
        "errors": len(base) - len(pairs),
        "exact_match_rate": exact / len(pairs),
        "diverged": len(first_div),
        "mean_first_divergence": float(np.mean(first_div)) if first_div else None,
        "min_first_divergence": int(min(first_div)) if first_div else None,
        "tokens_compared": len(diffs),
        "abs_logprob_diff": {
            "mean": float(d.mean()),
            "median": float(np.median(d)),
            "p99": float(np.percentile(d, 99)),
            "max": float(d.max()),
        },
    }
