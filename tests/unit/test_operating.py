"""The design's operating characteristics (eval/vse/stats/operating.py), checked against what the
decision rule guarantees: the MDE's power, alpha spending at the margin, and an A/A that stops
at the first look when the noise is small."""

import math

import pytest

from vse.stats import calibration as cal
from vse.stats.operating import GateModel, Plan, simulate

V = math.log1p(0.002) ** 2  # 0.2% start-to-start sd: the H200 decode gate's order


@pytest.mark.parametrize("starts,alpha", [(3, 0.0125), (6, 0.05)])
def test_a_change_of_the_mde_is_detected_with_80_percent_power(starts, alpha):
    """The minimum detectable effect names the change that the gates' own Welch test sees 80% of
    the time; the textbook (t + t) x SE it replaced was seen 55% of the time at 3 + 3 starts and
    the first look's alpha."""
    m = cal.mde(V, V, starts, alpha)
    oc = simulate([GateModel("d", False, 0.05, V, m)], Plan(starts, starts, alpha), n=6000, seed=1)
    assert oc.gates["d"]["worse"] == pytest.approx(0.80, abs=0.02)


def test_the_textbook_mde_overstated_power_at_few_starts():
    from scipy import stats as sps

    old = math.expm1((sps.t.ppf(1 - 0.0125 / 2, 4) + sps.t.ppf(0.8, 4)) * math.sqrt(2 * V / 3))
    oc = simulate([GateModel("d", False, 0.05, V, old)], Plan(3, 3, 0.0125), n=6000, seed=2)
    assert oc.gates["d"]["worse"] < 0.65


def test_a_candidate_exactly_at_the_margin_passes_at_most_alpha_half_over_every_look():
    """Sequential to 6 starts: every look may PASS it, and alpha spending keeps the total at
    alpha / 2 (spending all of alpha at each look would not)."""
    sd = math.log1p(0.02)  # noisy enough that several looks happen
    at_margin = [GateModel("thr", True, 0.05, sd**2, -0.05)]
    oc = simulate(at_margin, Plan(3, 6, 0.05), n=3000, seed=3)
    assert oc.gates["thr"].get("pass", 0) <= 0.025 + 0.006
    assert oc.mean_starts > 4  # it did look again
    unspent = simulate(at_margin, Plan(3, 3, 0.05), n=3000, seed=3)  # one look, all of alpha: ~2.5%
    assert unspent.gates["thr"].get("pass", 0) == pytest.approx(0.025, abs=0.008)


def test_an_aa_with_small_noise_passes_every_gate_at_the_first_look():
    models = [GateModel("tm", False, 0.05, V), GateModel("thr", True, 0.05, V)]
    oc = simulate(models, Plan(3, 6, 0.05), n=500, seed=4)
    assert oc.verdict == {"pass": 1.0} and oc.starts == {3: 1.0}


def test_a_regression_beyond_the_margin_fails_and_the_verdict_is_the_worst_gate():
    models = [GateModel("tm", False, 0.05, V, 0.08), GateModel("thr", True, 0.05, V, 0.0)]
    oc = simulate(models, Plan(3, 6, 0.05), n=500, seed=5)
    assert oc.verdict == {"fail": 1.0}
    assert oc.gates["thr"]["pass"] == 1.0 and oc.gates["tm"]["fail"] == 1.0


def test_a_failed_gate_settles_the_design_while_another_is_still_open():
    """The +0.85 ms calibration's shape (H100, 2026-12-06): the decode step clearly beyond its margin
    FAILs at the first look while throughput sits on its margin, undecided. The verdict is
    FAIL whatever throughput later says, so the design stops there instead of running to 6 + 6."""
    from vse.stats.decide import Outcome, settled

    assert settled([Outcome.FAIL, Outcome.INCONCLUSIVE])
    assert settled([Outcome.PASS, Outcome.PASS]) and settled([Outcome.FAIL, Outcome.PASS])
    assert not settled([Outcome.PASS, Outcome.INCONCLUSIVE])
    models = [GateModel("decode", False, 0.05, V, 0.08), GateModel("thr", True, 0.05, V, -0.05)]
    oc = simulate(models, Plan(3, 6, 0.05), n=500, seed=6)
    assert oc.verdict == {"fail": 1.0} and oc.starts[3] > 0.95  # the rest: decode not yet beyond at look 1
    assert oc.gates["thr"].get("inconclusive", 0) > 0.5  # it stopped with throughput still open
