"""Regressions across nights in one metric's series: change points from Apache Otava's E-divisive
(Hunter's windowed split-and-merge; run in an environment of its own because it pins numpy and
scipy), kept only when the shift is large against the series' own night-to-night noise and lasts;
a window-median fallback like the PyTorch HUD's where that environment or enough nights are
missing, named in every series' row; single bad nights reported as outliers, not changes. Pure
except `e_divisive`."""

from __future__ import annotations

import enum
import json
import math
import subprocess
from dataclasses import dataclass, field

import numpy as np

MIN_REL = 0.01  # no shift under 1% is a regression worth a page, whatever the noise
NOISE_K = 4.0  # a kept change moves the median by at least this many night-to-night noise sds
OUTLIER_Z = 4.0
WINDOW = 5  # nights per side for the window-median fallback

_EDIVISIVE = """
import json, sys
from otava.analysis import compute_change_points
d = json.load(sys.stdin)
cps, _ = compute_change_points(d["values"], window_len=d["window"], max_pvalue=d["pvalue"])
print(json.dumps(sorted(int(c.index) for c in cps)))
"""


class Method(str, enum.Enum):
    E_DIVISIVE = "e-divisive (apache-otava)"
    WINDOW_MEDIAN = "window median"


@dataclass(frozen=True)
class Change:
    index: int  # the first night of the new level
    before: float  # median of the nights before (up to the previous change)
    after: float  # median from this night (up to the next change)

    @property
    def rel(self) -> float:
        return self.after / self.before - 1


@dataclass
class Detection:
    method: Method
    noise: float  # robust relative night-to-night sd
    changes: list[Change] = field(default_factory=list)
    outliers: list[int] = field(default_factory=list)


def noise_of(x: np.ndarray) -> float:
    """Relative night-to-night noise: the MAD of successive log differences, as an sd of one night
    (differences have twice a night's variance). Robust to the steps and outliers it looks for."""
    if len(x) < 3:
        return float("nan")
    d = np.diff(np.log(x))
    return float(1.4826 * np.median(np.abs(d - np.median(d))) / math.sqrt(2))


def outliers(x: np.ndarray, noise: float) -> list[int]:
    """Nights far, in the same direction, from the level on both sides of them (two nights each;
    one side at the series' ends): one bad night. A step's first night is no outlier, since it
    agrees with the nights after it."""
    out = []
    lim = max(OUTLIER_Z * noise, MIN_REL)
    for i in range(len(x)):
        sides = [float(np.median(s)) for s in (x[max(0, i - 2) : i], x[i + 1 : i + 3]) if len(s)]
        devs = [math.log(x[i] / ref) for ref in sides]
        if devs and all(abs(d) > lim for d in devs) and len({d > 0 for d in devs}) == 1:
            out.append(i)
    return out


def e_divisive(values: list[float], python: str, pvalue: float = 0.001, window: int = 30) -> list[int]:
    """Change-point indices from Otava's E-divisive, run by `python` (the change-point environment)."""
    r = subprocess.run(
        [python, "-c", _EDIVISIVE],
        input=json.dumps({"values": values, "pvalue": pvalue, "window": window}),
        capture_output=True,
        text=True,
        timeout=600,
    )
    if r.returncode != 0:
        raise RuntimeError(f"e-divisive failed: {(r.stderr.strip().splitlines() or ['?'])[-1]}")
    return json.loads(r.stdout)


def window_candidates(x: np.ndarray, w: int = WINDOW) -> list[int]:
    """The HUD's rule, over the whole series: where the median of the next w nights differs most
    from the median of the previous w."""
    if len(x) < 2 * w:
        return []
    shifts = [(abs(math.log(np.median(x[i : i + w]) / np.median(x[i - w : i]))), i) for i in range(w, len(x) - w + 1)]
    i = max(shifts)[1]
    # Window medians place a step only to within a night or two: split where the two sides'
    # squared log deviations are least, within 2w nights around it.
    lo, hi, lx = max(0, i - 2 * w), min(len(x), i + 2 * w), np.log(x)
    cost = lambda j: lx[lo:j].var() * (j - lo) + lx[j:hi].var() * (hi - j)
    return [min(range(max(lo + 2, i - w), min(hi - 1, i + w)), key=cost)]


def refine(x: np.ndarray, cuts: list[int], reach: int = 2) -> list[int]:
    """E-divisive places a step to within a night or so: move each cut, within `reach` nights, to
    where the two sides (up to the neighbouring cuts) have the least squared log deviation."""
    cuts, lx = sorted(set(cuts)), np.log(x)
    out = []
    for j, c in enumerate(cuts):
        lo, hi = (cuts[j - 1] if j else 0), (cuts[j + 1] if j + 1 < len(cuts) else len(x))
        cost = lambda k, lo=lo, hi=hi: lx[lo:k].var() * (k - lo) + lx[k:hi].var() * (hi - k)
        span = range(max(lo + 2, c - reach), min(hi - 1, c + reach + 1))
        out.append(min(span, key=cost) if len(span) else c)
    return out


def confirm(x: np.ndarray, candidates: list[int], noise: float, bad: set[int]) -> list[Change]:
    """Keep the candidates whose level shift, with outlier nights left out, is at least
    max(NOISE_K x noise, MIN_REL) and lasts two nights or more."""
    keep, cuts = [], sorted(set(candidates))
    bounds = [0, *cuts, len(x)]
    for j, c in enumerate(cuts):
        lo, hi = bounds[j], bounds[j + 2]
        before = [x[i] for i in range(lo, c) if i not in bad]
        after = [x[i] for i in range(c, hi) if i not in bad]
        if len(before) < 2 or len(after) < 2:
            continue
        ch = Change(c, float(np.median(before)), float(np.median(after)))
        if abs(math.log1p(ch.rel)) >= max(NOISE_K * noise, MIN_REL):
            keep.append(ch)
    return keep


def detect(values: list[float], python: str | None = None) -> Detection:
    """Changes and outliers in one series (one value per night, in time order)."""
    x = np.asarray(values, float)
    noise = noise_of(x)
    if len(x) < 4 or not math.isfinite(noise):
        return Detection(Method.WINDOW_MEDIAN, noise)
    bad = set(outliers(x, noise))
    clean = [v for i, v in enumerate(values) if i not in bad]
    index = [i for i in range(len(values)) if i not in bad]
    if python and len(clean) >= 8:
        cuts = refine(np.asarray(clean), [c for c in e_divisive(clean, python) if 0 < c < len(clean)])
        method, cand = Method.E_DIVISIVE, [index[c] for c in cuts]
    else:
        method, cand = Method.WINDOW_MEDIAN, [index[c] for c in window_candidates(np.asarray(clean))]
    # Confirm until stable: a candidate that is not a lasting shift must not bound its neighbours' levels.
    kept = confirm(x, cand, noise, bad)
    while len(kept) < len(set(cand)):
        cand = [c.index for c in kept]
        kept = confirm(x, cand, noise, bad)
    return Detection(method, noise, kept, sorted(bad))
