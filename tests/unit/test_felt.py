"""What a user of the candidate release would feel: the per-run view and the TTFT modes decided
across starts (analysis/felt.py)."""

import math

from vse.analysis import felt
from vse.stats.estimate import MetricComparison, Verdict


def row(key, base, cand, base_starts, cand_starts):
    return MetricComparison(
        key, key, False, 1.0, 1.0, 0.0, -0.01, 0.01, Verdict.NO_CHANGE,
        baseline_runs=base, candidate_runs=cand, baseline_starts=base_starts, candidate_starts=cand_starts,
    )  # fmt: skip


def test_slow_mode_counted_per_start_and_decided_only_when_the_starts_say_so():
    # one run per start, 6 + 6 starts: every candidate start slow, no baseline start
    r = row(
        "median_ttft_ms",
        [400, 410, 405, 398, 402, 407],
        [900, 905, 910, 895, 902, 899],
        [0, 3, 4, 7, 8, 11],
        [1, 2, 5, 6, 9, 10],
    )
    m = felt.ttft_modes(r, 0.05)
    assert m is not None and m.decided and "Fisher" in m.test and m.p < 0.01
    assert [(c.arm, c.slow) for c in m.counts if c.slow] == [("candidate", 1)] * 6
    # 3 + 3 starts, two slow candidate starts and one slow baseline start: could be chance
    r = row("median_ttft_ms", [400, 410, 905], [900, 905, 402], [0, 3, 4], [1, 2, 5])
    m = felt.ttft_modes(r, 0.05)
    assert m is not None and not m.decided and m.p > 0.5
    # two runs per start: shares, not whole starts
    r = row(
        "median_ttft_ms",
        [400, 900, 410, 405, 900, 402],
        [900, 905, 910, 402, 902, 899],
        [0, 0, 3, 3, 4, 4],
        [1, 1, 2, 2, 5, 5],
    )
    m = felt.ttft_modes(r, 0.05)
    assert m is not None and "Mann-Whitney" in m.test and [c.runs for c in m.counts] == [2] * 6
    assert felt.ttft_modes(row("median_ttft_ms", [400, 401, 402], [403, 404, 405], [0, 3, 4], [1, 2, 5]), 0.05) is None


def test_the_view_exists_only_where_the_arms_ran_different_releases():
    comparison = [
        row("output_throughput", [100, 101], [99, 98], [0, 3], [1, 2]),
        row("median_ttft_ms", [400, 410], [405, 398], [0, 3], [1, 2]),
    ]
    env = lambda b, c: {"arms": {"baseline": {"vllm": b}, "candidate": {"vllm": c}}}
    arms = {}
    assert felt.felt_view(arms, env("0.26.0", "0.26.0"), comparison, 0.05) is None
    v = felt.felt_view(arms, env("0.25.1", "0.26.0"), comparison, 0.05)
    assert v is not None and (v.baseline_release, v.candidate_release) == ("0.25.1", "0.26.0")
    assert [(r.arm, r.start, r.run, r.values["output_throughput"]) for r in v.rows] == [
        ("baseline", 0, 1, 100.0), ("baseline", 3, 1, 101.0), ("candidate", 1, 1, 99.0), ("candidate", 2, 1, 98.0)
    ]  # fmt: skip
    assert math.isfinite(v.rows[0].values["median_ttft_ms"]) and v.modes is None
