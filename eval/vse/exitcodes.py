"""The suite's exit codes, one place: compare, sweep, qualify, calibrate, the CLI, bin/vse and the
docs all use these. CI and nightly jobs rely on them."""

from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    OK = 0  # every gate passed
    GATE_FAILED = 1  # a gate failed
    RUN_FAILED = 2  # the run itself failed: bad scenario, a server that crashed or hung, Ctrl-C, damaged data
    INCONCLUSIVE = 3  # no gate failed, but at least one could not be decided with the data measured
    UNSUPPORTED = 4  # the preflight refused this configuration on this machine before any server started
    BUSY = 5  # another comparison held the devices for the whole wait (--wait-lock): nothing ran; a retry may not

    @staticmethod
    def describe(code: int) -> str:
        try:
            return ExitCode(code).name.lower().replace("_", " ")
        except ValueError:
            return f"unknown exit code {code}"


class CiStep(enum.Enum):
    """What a CI step runs, for how its exit code is treated (SOFT_IN_CI)."""

    COMPARISON = "a comparison: bin/vse compare, a release entry"
    VERDICT = "a verdict folded from comparisons: the release index"
    OTHER = "anything else: the tests, the image, the trend, a pipeline upload"


# How every pipeline treats the codes (README "Exit codes"; tests/unit/test_buildkite.py holds each
# pipeline, static and emitted, to it): INCONCLUSIVE and UNSUPPORTED are soft (yellow, not red) for
# a comparison, never a failed run; a release's index folds refused entries into INCONCLUSIVE.
SOFT_IN_CI: dict[CiStep, frozenset[int]] = {
    CiStep.COMPARISON: frozenset({ExitCode.INCONCLUSIVE, ExitCode.UNSUPPORTED}),
    CiStep.VERDICT: frozenset({ExitCode.INCONCLUSIVE}),
    CiStep.OTHER: frozenset(),
}
# Retried automatically: a comparison that found its devices busy for its whole --wait-lock (two
# jobs on one host) ran nothing, so running it again later is safe; it is never a red build.
RETRY_IN_CI: dict[CiStep, frozenset[int]] = {
    CiStep.COMPARISON: frozenset({ExitCode.BUSY}),
    CiStep.VERDICT: frozenset(),
    CiStep.OTHER: frozenset(),
}


# One severity order for every place that folds several outcomes into one (a sweep's points, a
# qualification's entries, a calibration's comparisons): a failed run over a FAIL over INCONCLUSIVE
# over PASS; UNSUPPORTED (refused before anything ran) is listed, never worse than a pass. An unknown
# code is worst of all.
SEVERITY = {
    ExitCode.RUN_FAILED: 4,
    ExitCode.GATE_FAILED: 3,
    ExitCode.INCONCLUSIVE: 2,
    ExitCode.OK: 1,
    ExitCode.UNSUPPORTED: 0,
    ExitCode.BUSY: 0,
}


def worst(codes: list[int], default: int = ExitCode.OK) -> int:
    return max(codes, key=lambda c: SEVERITY.get(c, 5), default=default)  # type: ignore[call-overload]
