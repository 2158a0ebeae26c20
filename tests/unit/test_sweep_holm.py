"""A load sweep's exit code is its worst point's, so its FAIL tests are Holm-corrected across every
point and gated metric (eval/vse/stats/gates.py across_points), not at full alpha per point."""

import math

import numpy as np

from vse.scenario import GatesSpec
from vse.stats.estimate import Design, MetricComparison, Verdict
from vse.stats.gates import Outcome, across_points, performance

SPEC = GatesSpec(performance=[{"metric": "output_throughput", "max_worse_pct": 5}])


def _row(worse: float, se: float, df: float = 8.0) -> MetricComparison:
    """A throughput comparison whose log change toward worse is `worse` with standard error `se`."""
    return MetricComparison(
        "output_throughput",
        "Output throughput",
        True,
        1.0,
        math.exp(-worse),
        math.expm1(-worse),
        math.nan,
        math.nan,
        Verdict.NOT_AVAILABLE,
        Design.STARTS,
        se,
        df,
        5,
        5,
        math.nan,
        math.nan,
    )  # no per-start variances: no "more starts" estimate (fast)


def test_a_candidate_at_the_margin_fails_a_four_point_sweep_at_most_alpha_over_2_of_the_time():
    rng = np.random.default_rng(3)
    at_margin, se, alpha = -math.log(0.95), 0.01, 0.05
    fails = per_point_fails = 0
    for _ in range(4000):
        points = [performance([_row(at_margin + se * rng.standard_t(8), se)], SPEC, alpha) for _ in range(4)]
        per_point_fails += any(g.outcome is Outcome.FAIL for gs in points for g in gs)
        fails += any(g.outcome is Outcome.FAIL for gs in across_points(points, alpha) for g in gs)
    assert per_point_fails / 4000 > 0.07  # each point at full alpha: 9.2% here, 4 x 2.5% nearly
    assert fails / 4000 < 0.03  # 2.5% nominal (2.25% here), 0.25% Monte Carlo error


def test_a_clear_fail_stays_and_a_point_only_one_test_sees_turns_inconclusive():
    alpha = 0.05
    clear = performance([_row(0.15, 0.01)], SPEC, alpha)
    border = performance([_row(-math.log(0.95) + 0.026, 0.01)], SPEC, alpha)  # p about 0.016 on its own
    fine = performance([_row(0.0, 0.01)], SPEC, alpha)
    assert clear[0].outcome is border[0].outcome is Outcome.FAIL
    out = across_points([fine, border, clear], alpha)
    assert [g[0].outcome for g in out] == [Outcome.PASS, Outcome.INCONCLUSIVE, Outcome.FAIL]
    assert "Holm over its 3 gated tests" in out[1][0].detail
    assert across_points([border], alpha) == [border]  # one point: nothing to correct across
