"""Bisection over an ordered list of builds with noisy, three-outcome steps. Pure functions.

Each step is a comparison of one build against the known-good end, decided by the scenario's own
gates: FAIL says the build is bad (worse than the good end by more than a margin), PASS says good,
INCONCLUSIVE says neither, and the build is skipped as `git bisect skip` would (the next step tests
a neighbour). The answer is the first bad build, or, where skips sit at the boundary, the smallest
range the decided steps allow.

What it can claim: a decided step is wrong with probability at most its error rate (the sequential
design's alpha, spent across its looks, covers both wrong directions); the named build is wrong only
if some decided step on the path was, so the chance is at most the sum over the decided steps (a
union bound; `tests/unit/test_bisection.py` measures the real rate by simulation). The bound holds
for builds whose true change lies outside the margin's indifference zone: a build whose change sits
near the margin may read either way, and then "the first bad build" is not sharply defined.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from vse.exitcodes import ExitCode


class Verdict(enum.Enum):
    GOOD = "good"
    BAD = "bad"
    SKIP = "skip"


def verdict_of(exit_code: int) -> Verdict:
    """A step's comparison exit code as a bisection verdict: PASS good, FAIL bad, anything else skip
    (INCONCLUSIVE, a run that failed, a build the preflight refused)."""
    return {ExitCode.OK: Verdict.GOOD, ExitCode.GATE_FAILED: Verdict.BAD}.get(exit_code, Verdict.SKIP)  # type: ignore[call-overload]


@dataclass
class Search:
    """builds 0..n-1 in order; good and bad: the known ends' indices (good < bad). verdicts: the
    steps so far, index -> verdict, in the order they were made."""

    n: int
    good: int
    bad: int
    verdicts: dict[int, Verdict] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not 0 <= self.good < self.bad < self.n:
            raise ValueError(f"the good end ({self.good}) must come before the bad end ({self.bad}) in 0..{self.n - 1}")

    def bounds(self) -> tuple[int, int]:
        """(lo, hi): the newest build known good and the oldest known bad after lo."""
        lo, hi = self.good, self.bad
        for i, v in self.verdicts.items():  # only points inside (lo, hi) are ever tested
            if v is Verdict.GOOD and lo < i < hi:
                lo = i
            elif v is Verdict.BAD and lo < i < hi:
                hi = i
        return lo, hi

    def open_points(self) -> list[int]:
        lo, hi = self.bounds()
        return [i for i in range(lo + 1, hi) if i not in self.verdicts]

    def next_points(self, k: int = 1) -> list[int]:
        """The k builds to test next (k agents: a k-ary split of the range), nearest the points that
        cut the open range into k + 1 equal parts; none when the range is settled."""
        lo, hi = self.bounds()
        free = self.open_points()
        chosen: list[int] = []
        for j in range(1, k + 1):
            target = lo + j * (hi - lo) / (k + 1)
            left = [i for i in free if i not in chosen]
            if not left:
                break
            chosen.append(min(left, key=lambda i: (abs(i - target), i)))
        return sorted(chosen)

    def done(self) -> bool:
        return not self.next_points()

    def culprit(self) -> int | None:
        """The first bad build, when the decided steps name one."""
        lo, hi = self.bounds()
        return hi if hi - lo == 1 else None

    def skipped_between(self) -> list[int]:
        lo, hi = self.bounds()
        return [i for i in range(lo + 1, hi) if self.verdicts.get(i) is Verdict.SKIP]


def error_bound(step_alphas: list[float]) -> float:
    """At most this chance that the answer is wrong: the decided steps' error rates summed."""
    return min(1.0, sum(step_alphas))


def more_than_one_change(culprit: tuple[float, float], bad_end: tuple[float, float], worse_up: bool) -> bool:
    """Whether the bad end is worse than the culprit alone explains: their intervals of the failed
    gate's change (low, high, in the metric's own direction) do not overlap, the bad end's beyond."""
    return bad_end[0] > culprit[1] if worse_up else bad_end[1] < culprit[0]
