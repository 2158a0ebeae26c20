"""The accuracy non-inferiority gate's interval (Tango's paired score interval): checked against a
published value, and its P(PASS) for a candidate exactly at the margin that only loses questions
(what a fault looks like) at most alpha/2, where Newcombe's hybrid interval exceeded it."""

import numpy as np
import pytest

from vse.rundir.records import AccuracyResult
from vse.scenario import GatesSpec
from vse.stats import gates
from vse.stats import proportions as prop
from vse.stats.gates import Outcome


def test_tango_matches_the_published_value():
    # Cavo et al. 2012 as Fagerland, Lydersen and Laake (2017) tabulate it: 59, 6, 16, 80 -> -0.0621 [-0.1240, -0.0054]
    lo, hi = prop.tango_paired(prop.Paired(161, 59, 16, 6, 80))
    assert (round(lo, 4), round(hi, 4)) == (-0.1240, -0.0054)


def _result(correct: np.ndarray) -> AccuracyResult:
    n = len(correct)
    return AccuracyResult(
        scores={"t/acc,none": float(correct.mean())},
        samples={"t": {"original": n, "effective": n}},
        per_question={"t/acc,none": {str(i): int(v) for i, v in enumerate(correct)}},
    )


def _pass_rate(interval, n: int, base_acc: float, margin: float = 0.05, sims: int = 2000) -> float:
    rng = np.random.default_rng(11)
    passed = 0
    for _ in range(sims):
        base = rng.random(n) < base_acc
        cand = base & ~(rng.random(n) < margin / base_acc)  # loses questions only, margin of them on average
        a, b, c = int((base & cand).sum()), int((base & ~cand).sum()), int((cand & ~base).sum())
        passed += interval(prop.Paired(n, a, b, c, n - a - b - c))[0] > -margin
    return passed / sims


@pytest.mark.parametrize("n, base_acc", [(40, 0.5), (60, 0.7), (200, 0.5)])
def test_a_candidate_losing_exactly_the_margin_passes_at_most_alpha_over_2(n, base_acc):
    assert _pass_rate(prop.tango_paired, n, base_acc) < 0.025
    assert _pass_rate(prop.newcombe_paired, n, base_acc) > 0.04  # the interval the gate used before: 4.3-10%


def test_the_gate_uses_it_identical_arms_pass_once_the_questions_can_show_it():
    same = np.array([1, 0] * 100)  # 200 questions, 50%, no question answered differently
    (r,) = gates.accuracy_noninferiority(_result(same), _result(same), GatesSpec(accuracy_noninferiority_margin=0.03))
    assert r.outcome is Outcome.PASS  # 0 of 200 discordant rules out a 3-point drop (bound -1.9%)
    few = np.array([1, 0] * 20)  # 40 questions cannot rule out 3 points even with no discordance (bound -8.8%)
    (r,) = gates.accuracy_noninferiority(_result(few), _result(few), GatesSpec(accuracy_noninferiority_margin=0.03))
    assert r.outcome is Outcome.INCONCLUSIVE


@pytest.mark.parametrize("n, base_acc", [(60, 0.7), (200, 0.5)])
def test_the_gate_itself_passes_a_candidate_losing_exactly_the_margin_at_most_alpha_over_2(n, base_acc):
    """The at-margin rate through gates.accuracy_noninferiority, the function every run calls: a
    gate that went back to Newcombe's interval (4-10% here) fails this, not only the interval test."""
    margin, rng, sims, passed = 0.05, np.random.default_rng(12), 1000, 0
    spec = GatesSpec(accuracy_noninferiority_margin=margin)
    for _ in range(sims):
        base = rng.random(n) < base_acc
        cand = base & ~(rng.random(n) < margin / base_acc)
        (r,) = gates.accuracy_noninferiority(_result(base), _result(cand), spec)
        passed += r.outcome is Outcome.PASS
    assert passed / sims < 0.025


def test_the_at_margin_test_would_catch_newcombe_in_the_gate(monkeypatch):
    monkeypatch.setattr(prop, "tango_paired", prop.newcombe_paired)
    with pytest.raises(AssertionError):
        test_the_gate_itself_passes_a_candidate_losing_exactly_the_margin_at_most_alpha_over_2(200, 0.5)


def test_a_required_accuracy_gate_is_met_by_the_non_inferiority_gates_whatever_their_names():
    """gates.require: [accuracy] once looked for "accuracy" in gate names, which lm-eval's metric
    keys ("gsm8k/exact_match,strict-match non-inferior") do not contain: a run whose accuracy gates
    all decided still came out INCONCLUSIVE. The gate functions now say which family they decide."""
    from vse.analysis.verdict import required
    from vse.scenario import GateFamily

    s = _scenario_requiring_accuracy()
    base = _result(np.arange(200) % 2 == 0)
    decided = gates.sample_counts(
        "baseline", base, s.accuracy.model_copy(update={"tasks": ["t"]})
    ) + gates.accuracy_noninferiority(base, base, s.gates)
    assert [r.family for r in decided] == [GateFamily.COMPLETENESS, GateFamily.ACCURACY]
    assert "accuracy" not in decided[1].name and decided[1].outcome is Outcome.PASS
    assert required(s, decided) == []
    # the completeness checks alone are no accuracy decision; nor is an accuracy gate that was n/a
    (missing,) = required(s, decided[:1])
    assert missing.outcome is Outcome.INCONCLUSIVE and "decided no accuracy gate" in missing.detail
    weak = _result(np.arange(200) % 100 == 0)  # 2 of 200 right: no drop of the margin can be seen
    (na,) = required(s, gates.accuracy_noninferiority(weak, weak, s.gates))
    assert na.outcome is Outcome.INCONCLUSIVE and "not applicable here" in na.detail


def _scenario_requiring_accuracy():
    from conftest import ROOT

    from vse.orchestration.scenario_check import load_scenario

    return load_scenario(ROOT / "scenarios" / "h200-qwen2.5-coder-1.5b-fp8-gsm8k.yaml")
