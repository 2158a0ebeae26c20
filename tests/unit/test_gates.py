import pytest

from vse.quality import agreement
from vse.quality.agreement import Completion
from vse.rundir.records import AccuracyResult
from vse.scenario import AccuracySpec, GatesSpec, PerfGate
from vse.stats import gates
from vse.stats.estimate import MetricComparison, Verdict
from vse.stats.gates import Outcome

SPEC = AccuracySpec(
    limit=100, reference={"gsm8k/exact_match,flexible-extract": 0.944, "gsm8k/exact_match,strict-match": 0.886}
)


def acc(flex, strict, n=100, se=0.01):
    return AccuracyResult(
        scores={"gsm8k/exact_match,flexible-extract": flex, "gsm8k/exact_match,strict-match": strict},
        stderrs={"gsm8k/exact_match,flexible-extract": se, "gsm8k/exact_match,strict-match": se},
        samples={"gsm8k": {"original": 1319, "effective": n}},
    )


def outcomes(rs):
    return [r.outcome for r in rs]


def test_reference_pass_and_fail():
    assert outcomes(gates.accuracy_reference("new", acc(0.94, 0.88), SPEC, 0.08)) == [Outcome.PASS, Outcome.PASS]
    res = gates.accuracy_reference("new", acc(0.80, 0.88), SPEC, 0.08)
    assert outcomes(res) == [Outcome.FAIL, Outcome.PASS] and "floor 0.8685" in res[0].detail


def test_too_few_samples_fails():
    assert outcomes(gates.sample_counts("new", acc(0.9, 0.9, n=100), SPEC)) == [Outcome.PASS]
    r = gates.sample_counts("new", acc(0.9, 0.9, n=60), SPEC)[0]
    assert r.outcome is Outcome.FAIL and "60 of 100" in r.detail


def test_missing_metric_fails():
    a = acc(0.94, 0.88)
    del a.scores["gsm8k/exact_match,strict-match"]
    res = gates.accuracy_reference("new", a, SPEC, 0.08)
    assert outcomes(res) == [Outcome.PASS, Outcome.FAIL] and "missing" in res[1].detail
    ni = gates.accuracy_noninferiority(acc(0.94, 0.88), a, GatesSpec())
    assert Outcome.FAIL in outcomes(ni)


def paired(n, base_right, cand_right):
    """Per-question records: question i right when i < base_right (resp. cand_right)."""
    key = "gsm8k/exact_match,flexible-extract"
    mk = lambda k: AccuracyResult(
        scores={key: k / n},
        samples={"gsm8k": {"original": 1319, "effective": n}},
        per_question={key: {str(i): int(i < k) for i in range(n)}},
    )
    return mk(base_right), mk(cand_right)


def test_noninferiority_gate_is_paired_and_has_three_outcomes():
    g = GatesSpec(accuracy_noninferiority_margin=0.05)
    b, c = paired(400, 360, 360)
    (r,) = gates.accuracy_noninferiority(b, c, g)
    assert r.outcome is Outcome.PASS and "paired on 400 questions" in r.detail
    b, c = paired(400, 360, 300)
    assert gates.accuracy_noninferiority(b, c, g)[0].outcome is Outcome.FAIL
    b, c = paired(40, 36, 34)  # a 5-point drop on 40 questions: cannot tell
    assert gates.accuracy_noninferiority(b, c, g)[0].outcome is Outcome.INCONCLUSIVE


def test_a_score_with_stderr_zero_is_not_exact():
    """Both arms 0 of 16 with stderr 0: the old gate called that a pass; nothing could be lost."""
    g = GatesSpec(accuracy_noninferiority_margin=0.1)
    b, c = paired(16, 0, 0)
    (r,) = gates.accuracy_noninferiority(b, c, g)
    assert r.outcome is Outcome.NOT_APPLICABLE and "not informative" in r.detail
    b, c = paired(16, 16, 16)  # both perfect on 16: the paired interval still has width
    (r,) = gates.accuracy_noninferiority(b, c, g)
    assert r.outcome is Outcome.INCONCLUSIVE and "[-0.1" in r.detail


def test_unpaired_fallback_without_per_question_records():
    g = GatesSpec(accuracy_noninferiority_margin=0.03)
    r = gates.accuracy_noninferiority(acc(0.94, 0.88, n=1319), acc(0.94, 0.88, n=1319), g)
    assert {x.outcome for x in r} == {Outcome.PASS} and "unpaired" in r[0].detail
    r = gates.accuracy_noninferiority(acc(0.94, 0.88, n=300), acc(0.94, 0.88, n=300), g)
    assert {x.outcome for x in r} == {Outcome.INCONCLUSIVE}
    r = gates.accuracy_noninferiority(acc(0.94, 0.88, n=1319), acc(0.70, 0.60, n=1319), g)
    assert {x.outcome for x in r} == {Outcome.FAIL}


def test_reference_gate_on_a_subset_says_so_and_can_be_inconclusive():
    spec = AccuracySpec(limit=20, reference={"gsm8k/exact_match,flexible-extract": 0.944})
    a = acc(0.85, 0.8, n=20)  # below the floor 0.868, but 20 questions cannot show it
    (r,) = gates.accuracy_reference("new", a, spec, 0.08)
    assert r.outcome is Outcome.INCONCLUSIVE and "subset of 20 of 1319" in r.detail
    a = acc(0.30, 0.3, n=20)
    assert gates.accuracy_reference("new", a, spec, 0.08)[0].outcome is Outcome.FAIL


def row(key, change, se=0.005, higher=False, n=3):
    from vse.stats.estimate import Design

    return MetricComparison(
        key,
        key,
        higher,
        1.0,
        1.0 + change,
        change,
        change - 0.01,
        change + 0.01,
        Verdict.NO_CHANGE,
        Design.STARTS,
        se,
        2 * n - 2,
        n,
        n,
        se * se * n / 2,
        se * se * n / 2,
    )


def test_performance_gate_has_three_outcomes():
    g = GatesSpec(performance=[PerfGate(metric="median_ttft_ms", max_worse_pct=5)])
    assert outcomes(gates.performance([row("median_ttft_ms", 0.20)], g, 0.05)) == [Outcome.FAIL]
    assert outcomes(gates.performance([row("median_ttft_ms", 0.0)], g, 0.05)) == [Outcome.PASS]
    assert outcomes(gates.performance([row("median_ttft_ms", 0.05)], g, 0.05)) == [Outcome.INCONCLUSIVE]
    assert outcomes(gates.performance([row("median_ttft_ms", -0.2)], g, 0.05)) == [Outcome.PASS]
    tp = GatesSpec(performance=[PerfGate(metric="output_throughput", max_worse_pct=5)])
    assert outcomes(gates.performance([row("output_throughput", -0.2, higher=True)], tp, 0.05)) == [Outcome.FAIL]
    assert outcomes(gates.performance([], g, 0.05)) == [Outcome.INCONCLUSIVE]  # no data is not a pass
    bad = GatesSpec(performance=[PerfGate(metric="median_ttft_msec", max_worse_pct=5)])
    assert outcomes(gates.performance([row("median_ttft_ms", 0.0)], bad, 0.05)) == [Outcome.FAIL]  # a typo neither
    noisy = row("median_ttft_ms", 0.02, se=0.05)  # the old gate passed this: point within, interval wide
    (r,) = gates.performance([noisy], g, 0.05)
    assert r.outcome is Outcome.INCONCLUSIVE and r.more_starts and "more server start" in r.detail


def comps(lps, tokens=None):
    return [
        Completion("p", text="".join(t), tokens=t, logprobs=lp)
        for lp, t in zip(lps, tokens or [[f"t{i}" for i in range(len(x))] for x in lps])
    ]


def test_agreement_gate_calibrated_by_self_agreement():
    g = GatesSpec(agreement_mode="gate")
    base = comps([[-0.5, -1.0, -0.2, -2.0]] * 4)
    close = comps([[-0.505, -1.01, -0.2, -2.0]] * 4)
    far = comps([[-0.9, -1.6, -0.7, -2.8]] * 4)
    self_cmp = agreement.compare(base, base)
    assert outcomes(gates.agreement(agreement.compare(base, close), self_cmp, g)) == [Outcome.PASS]
    (r,) = gates.agreement(agreement.compare(base, far), self_cmp, g)
    assert r.outcome is Outcome.FAIL and "limit 0.0100" in r.detail
    assert outcomes(gates.agreement(None, None, g)) == [Outcome.FAIL]
    # A run stopped on its time budget before the candidate ran is not failed: RESUME goes on.
    assert outcomes(gates.agreement(None, None, g, pending=True)) == [Outcome.INCONCLUSIVE]
    assert gates.agreement(None, None, GatesSpec(agreement_mode="off")) == []
    (r,) = gates.agreement(agreement.compare(base, far), self_cmp, GatesSpec(agreement_mode="report"))
    assert (
        r.outcome is Outcome.NOT_APPLICABLE and r.reported and r.shown == "REPORTED" and "as a gate: FAIL" in r.detail
    )


def test_agreement_on_degenerate_outputs_is_not_informative():
    flat = comps([[-11.76] * 8] * 4, [["!"] * 8] * 4)  # what vLLM's dummy weights give
    cmp = agreement.compare(flat, flat)
    assert cmp["exact_match_rate"] == 1.0 and cmp["degenerate"]
    (r,) = gates.agreement(cmp, cmp, GatesSpec())
    assert r.outcome is Outcome.NOT_APPLICABLE and "not informative" in r.detail


def test_failed_requests_fail_the_run():
    assert gates.failed_requests("candidate", 0, 100, 0.0).outcome is Outcome.PASS
    assert gates.failed_requests("candidate", 1, 100, 0.0).outcome is Outcome.FAIL
    assert gates.failed_requests("candidate", 1, 100, 0.02).outcome is Outcome.PASS
    kinds = gates.error_kinds(["HTTP 500: boom", "TimeoutError: read", "HTTP 500: again"])
    assert kinds == {"HTTP 500": "HTTP 500: boom", "TimeoutError": "TimeoutError: read"}
    r = gates.failed_requests("candidate", 3, 100, 0.0, kinds)
    assert "first HTTP 500: HTTP 500: boom" in r.detail and "first TimeoutError" in r.detail


def test_a_margin_of_100_percent_on_a_higher_is_better_metric_allows_anything():
    import math

    from vse.stats.decide import margin_log

    assert margin_log(1.0, True) == math.inf and margin_log(2.0, True) == math.inf
    assert margin_log(0.05, True) == -math.log(0.95) and margin_log(1.0, False) == math.log(2.0)


def _scored(rows, toks):
    """Teacher-forced scores of one text per row: a position's top-k logprobs from its logits."""
    from vse.quality.fidelity import Scored

    return [
        Scored(
            "t",
            tokens=[f"x{i}" for i in range(len(r))],
            top_logprobs=[None] + [dict(zip(toks, map(float, p))) for p in r[1:]],
        )
        for r in rows
    ]


def test_fidelity_fails_an_extra_error_passes_a_copy_and_a_more_exact_kernel():
    """The candidate's distance to the reference against the baseline's, paired by text: a fault (the
    baseline's error plus its own) FAILs, the baseline's own numerics or better ones PASS."""
    import numpy as np

    from vse.quality import fidelity

    rng = np.random.default_rng(0)
    toks = [f"t{i}" for i in range(5)]
    ref = rng.normal(0, 2, (16, 200, 5))
    base = ref + rng.normal(0, 0.1, ref.shape)
    spec = GatesSpec(fidelity_max_extra_pct=10)
    r, b = _scored(ref, toks), _scored(base, toks)
    fault = fidelity.compare(b, _scored(base + rng.normal(0, 0.05, ref.shape), toks), r)
    assert fault["texts"] == 16 and fault["positions"] == 16 * 199 and 1.2 < fault["ratio_low"] < fault["ratio"] < 1.3
    assert gates.fidelity(fault, spec, "torch")[0].outcome == Outcome.FAIL
    same = fidelity.compare(b, b, r)
    assert (same["ratio"], same["ratio_low"], same["ratio_high"]) == (1.0, 1.0, 1.0)
    assert gates.fidelity(same, spec, "torch")[0].outcome == Outcome.PASS
    exact = fidelity.compare(b, _scored(ref + rng.normal(0, 0.02, ref.shape), toks), r)
    assert exact["ratio_high"] < 0.1 and gates.fidelity(exact, spec, "torch")[0].outcome == Outcome.PASS
    # a 1% extra error in distance is within a 0.5% margin's reach of neither side with 16 texts
    small = fidelity.compare(b, _scored(base + rng.normal(0, 0.01, ref.shape), toks), r)
    assert gates.fidelity(small, GatesSpec(fidelity_max_extra_pct=1), "torch")[0].outcome == Outcome.INCONCLUSIVE


def test_fidelity_without_scores_degenerate_or_reported():
    from vse.quality import fidelity

    toks = ["a", "b"]
    flat = _scored([[[0.0, 0.0]] * 3] * 4, toks)
    deg = fidelity.compare(flat, flat, flat)
    assert "exactly as the reference" in deg["degenerate"]
    assert gates.fidelity(deg, GatesSpec(), "torch")[0].outcome == Outcome.NOT_APPLICABLE
    assert gates.fidelity(None, GatesSpec(), "torch")[0].outcome == Outcome.FAIL
    assert gates.fidelity(None, GatesSpec(), "torch", pending=True)[0].outcome == Outcome.INCONCLUSIVE
    broken = fidelity.compare(flat, [fidelity.Scored("t", error="HTTP 500")] * 4, flat)
    assert broken["failed_texts"] == 4 and gates.fidelity(broken, GatesSpec(), "torch")[0].outcome == Outcome.FAIL
    g = fidelity.compare(
        _scored([[[0, 0], [0.0, 1.0]]] * 3, toks),
        _scored([[[0, 0], [0.0, 2.0]]] * 3, toks),
        _scored([[[0, 0], [0.0, 0.0]]] * 3, toks),
    )
    rep = gates.fidelity(g, GatesSpec(fidelity_mode="report"), "torch")[0]
    assert rep.outcome == Outcome.NOT_APPLICABLE and rep.reported and "as a gate: FAIL" in rep.detail


@pytest.mark.parametrize(
    "table, expected",
    [
        ((12, 3, 1, 24), (-0.156, 0.058)),  # reference values (Newcombe 1998 method 10 with its continuity
        ((30, 6, 2, 2), (-0.251, 0.050)),  # adjustment of phi; contingencytables, Altman 2000)
    ],
)
def test_newcombe_paired_interval_matches_the_reference_implementation(table, expected):
    from vse.stats import proportions as prop

    lo, hi = prop.newcombe_paired(prop.Paired(sum(table), *table))
    assert (round(lo, 3), round(hi, 3)) == expected
