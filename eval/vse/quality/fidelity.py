"""Fidelity to a reference: is the candidate farther from a near-exact server than the baseline is?
Pure functions over recorded scores.

Why not agreement between the two arms alone: on random weights at a trained model's scale two
supported FP8 kernels (CUTLASS, torch) differ more from each other than CUTLASS does from itself
with a 2% scale fault in one layer (docs/gpu.md has the figures), so no
threshold on that difference passes the one and fails the other. A reference orders them: a
kernel no less exact than the baseline's is no farther from it; a fault adds its error to
whatever the baseline's kernel already has.

The three servers score the same fixed texts teacher-forced (the prompt's own top-k logprobs),
so every position has the same context on every server, not only the first generated one, and
a text of 1,000 tokens gives 1,000 positions. Per text, the distance to the reference is the
mean squared difference of the top-k logprobs both listed; the candidate's and the baseline's
are paired by text, and the per-text log of candidate/baseline gets a t interval (df = texts - 1),
back-transformed: the geometric mean over texts of how much farther the candidate is.

Why per-text log ratios, not the ratio of the two means (this gate's first interval, the ratio
estimator's linearisation): texts differ in how far any kernel lands from the reference by orders
of magnitude, so both means follow a few hard texts and their ratio is skewed; at a text-to-text
spread of 1.0 (log sd) that interval PASSed a candidate at the margin 8% of the time instead of
2.5% (tests/unit/test_fidelity.py). A text's own difficulty cancels in its log ratio."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from vse.rundir.layout import RunDir
from vse.scenario import ARMS


@dataclass
class Scored:
    text: str
    tokens: list[str] = field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = field(default_factory=list)
    error: str = ""


def load(path: Path) -> list[Scored] | None:
    if not path.is_file():
        return None
    with open(path) as f:
        return [Scored(**json.loads(line)) for line in f if line.strip()]


def topk_sq_distance(tx: dict[str, float] | None, ty: dict[str, float] | None) -> float:
    """Mean squared difference of the logprobs two servers gave the tokens both listed at one position."""
    # in the first server's order, not a set's: a set's order changes with Python's string hashing
    # from one process to the next, and so did the last digit of every rebuilt report's figures
    x, y = tx or {}, ty or {}
    common = [k for k in x if k in y]
    return float(np.mean([(x[k] - y[k]) ** 2 for k in common])) if common else math.nan


def text_distance(a: Scored, b: Scored) -> tuple[float, int]:
    """(mean squared top-k distance over the text's positions, positions compared); nan when the
    two did not score the same tokens (an error, or another tokenization)."""
    if a.error or b.error or a.tokens != b.tokens:
        return math.nan, 0
    d = [topk_sq_distance(x, y) for x, y in zip(a.top_logprobs, b.top_logprobs) if x and y]
    d = [v for v in d if math.isfinite(v)]
    return (float(np.mean(d)), len(d)) if d else (math.nan, 0)


# A text one server scored exactly as the reference (distance 0) has no log ratio: distances are
# floored at this share of the median text's distance (both arms), "a thousand times closer" at most.
# The median, not the mean: when a few hard texts dominate the mean, a floor set from it clips the
# easy texts of both arms to one value, their log ratios to 0, and the interval narrows past its
# level (docs/statistics.md; tests/unit/test_fidelity.py checks the at-margin rate).
FLOOR = 1e-3


def ratio_interval(c: np.ndarray, b: np.ndarray, alpha: float) -> tuple[float, float, float, float]:
    """The geometric mean over texts of c / b and its two-sided (1 - alpha) interval, paired by
    index: a t interval on the per-text log ratios, back-transformed; and the log ratio's standard
    error (with n - 1 degrees of freedom: a gate's p-value at its margin comes from it)."""
    both = np.concatenate([c, b])
    positive = both[both > 0]
    floor = FLOOR * float(np.median(positive)) if positive.size else 1.0
    d = np.log(np.maximum(c, floor) / np.maximum(b, floor))
    m, n = float(d.mean()), len(d)
    se = float(d.std(ddof=1) / math.sqrt(n))
    half = float(stats.t.ppf(1 - alpha / 2, n - 1)) * se
    return math.exp(m), math.exp(m - half), math.exp(m + half), se


def compare(base: list[Scored], cand: list[Scored], ref: list[Scored], alpha: float = 0.05) -> dict[str, Any]:
    """The candidate's and the baseline's distances to the reference, per text and as a ratio."""
    rows = [(text_distance(b, r), text_distance(c, r)) for b, c, r in zip(base, cand, ref)]
    ok = [(db, dc, n) for (db, n), (dc, _) in rows if math.isfinite(db) and math.isfinite(dc)]
    out: dict[str, Any] = {
        "texts": len(ok),
        "failed_texts": len(rows) - len(ok),
        "positions": sum(n for _, _, n in ok),
        "confidence": 1 - alpha,
    }
    if len(ok) < 2:
        return out
    db, dc = np.array([x[0] for x in ok]), np.array([x[1] for x in ok])
    out.update(
        baseline_sq_distance=float(db.mean()),
        candidate_sq_distance=float(dc.mean()),
        per_text={"baseline": db.tolist(), "candidate": dc.tolist()},
    )
    if db.mean() == 0:
        out["degenerate"] = "the baseline scores every text exactly as the reference does"
        return out
    out["ratio"], out["ratio_low"], out["ratio_high"], out["log_ratio_se"] = ratio_interval(dc, db, alpha)
    return out


def from_run(run_dir: Path, alpha: float) -> dict[str, Any] | None:
    """The comparison from a run directory's scores, or None before all three servers scored."""
    base, cand, ref = (load(RunDir(run_dir).arm(n).scores) for n in (*ARMS, "reference"))
    if base is None or cand is None or ref is None:
        return None
    return compare(base, cand, ref, alpha)
