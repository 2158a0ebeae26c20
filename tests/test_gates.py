from eval import agreement, gates
from eval.accuracy import AccuracyResult
from eval.agreement import Completion
from eval.gates import Outcome
from eval.scenario import AccuracySpec, GatesSpec, PerfGate
from eval.stats import MetricComparison, Verdict

SPEC = AccuracySpec(limit=100, reference={"gsm8k/exact_match,flexible-extract": 0.944,
                                          "gsm8k/exact_match,strict-match": 0.886})


def acc(flex, strict, n=100, se=0.01):
    return AccuracyResult(scores={"gsm8k/exact_match,flexible-extract": flex, "gsm8k/exact_match,strict-match": strict},
                          stderrs={"gsm8k/exact_match,flexible-extract": se, "gsm8k/exact_match,strict-match": se},
                          samples={"gsm8k": {"original": 1319, "effective": n}})


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
    mk = lambda k: AccuracyResult(scores={key: k / n}, samples={"gsm8k": {"original": 1319, "effective": n}},
                                  per_question={key: {str(i): int(i < k) for i in range(n)}})
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
    from eval.stats import Design
    return MetricComparison(key, key, higher, 1.0, 1.0 + change, change, change - 0.01, change + 0.01,
                            Verdict.NO_CHANGE, Design.STARTS, se, 2 * n - 2, n, n, se * se * n / 2, se * se * n / 2)


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
    return [Completion("p", text="".join(t), tokens=t, logprobs=l)
            for l, t in zip(lps, tokens or [[f"t{i}" for i in range(len(l))] for l in lps])]


def test_agreement_gate_calibrated_by_self_agreement():
    g = GatesSpec()
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
    assert r.outcome is Outcome.NOT_APPLICABLE and "would be FAIL" in r.detail


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
    from eval.decide import margin_log
    assert margin_log(1.0, True) == math.inf and margin_log(2.0, True) == math.inf
    assert margin_log(0.05, True) == -math.log(0.95) and margin_log(1.0, False) == math.log(2.0)


def test_fidelity_to_a_reference_sees_an_extra_error_and_not_a_copy():
    """A candidate that carries the baseline's own error plus an independent one (a fault) is
    farther from the reference; one identical to the baseline is not."""
    import numpy as np
    rng = np.random.default_rng(0)
    toks = [f"t{i}" for i in range(5)]

    def comps(logits):
        return [Completion("p", tokens=["t0"], logprobs=[float(r[0])], top_logprobs=[dict(zip(toks, map(float, r)))])
                for r in logits]

    ref = rng.normal(0, 2, (40, 5))
    base = ref + rng.normal(0, 0.3, ref.shape)
    fault = base + rng.normal(0, 0.3, ref.shape)
    f = agreement.fidelity(comps(base), comps(fault), comps(ref))
    assert f["prompts"] == 40 and f["ratio"] > 1.5 and f["p_farther"] < 0.01
    same = agreement.fidelity(comps(base), comps(base), comps(ref))
    assert same["ratio"] == 1.0 and same["p_farther"] == 1.0
    closer = agreement.fidelity(comps(base), comps(ref + rng.normal(0, 0.05, ref.shape)), comps(ref))
    assert closer["ratio"] < 0.2 and closer["p_farther"] > 0.5  # a more exact kernel is never "farther"
