from eval import gates
from eval.accuracy import AccuracyResult
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


def test_noninferiority_gate():
    g = GatesSpec(accuracy_noninferiority_margin=0.02)
    assert set(outcomes(gates.accuracy_noninferiority(acc(0.94, 0.88, se=0.002), acc(0.94, 0.88, se=0.002), g))) == {Outcome.PASS}
    assert set(outcomes(gates.accuracy_noninferiority(acc(0.94, 0.88, se=0.002), acc(0.85, 0.80, se=0.002), g))) == {Outcome.FAIL}


def row(key, change, verdict, higher=False):
    return MetricComparison(key, key, higher, 1.0, 1.0 + change, change, change - 0.01, change + 0.01, None, verdict)


def test_performance_gate_needs_size_and_significance():
    g = GatesSpec(performance=[PerfGate(metric="median_ttft_ms", max_worse_pct=5)])
    assert outcomes(gates.performance([row("median_ttft_ms", 0.08, Verdict.WORSE)], g)) == [Outcome.FAIL]
    assert outcomes(gates.performance([row("median_ttft_ms", 0.08, Verdict.NO_CHANGE)], g)) == [Outcome.PASS]
    assert outcomes(gates.performance([row("median_ttft_ms", 0.03, Verdict.WORSE)], g)) == [Outcome.PASS]
    assert outcomes(gates.performance([row("median_ttft_ms", -0.2, Verdict.BETTER)], g)) == [Outcome.PASS]
    tp = GatesSpec(performance=[PerfGate(metric="output_throughput", max_worse_pct=5)])
    assert outcomes(gates.performance([row("output_throughput", -0.1, Verdict.WORSE, True)], tp)) == [Outcome.FAIL]
    assert outcomes(gates.performance([], g)) == [Outcome.FAIL]  # unknown metric is not a silent pass


def test_agreement_gate():
    g = GatesSpec(agreement_min_exact_match=0.9)
    assert outcomes(gates.agreement({"prompts": 10, "exact_match_rate": 1.0}, g)) == [Outcome.PASS]
    assert outcomes(gates.agreement({"prompts": 10, "exact_match_rate": 0.5}, g)) == [Outcome.FAIL]
    assert outcomes(gates.agreement(None, g)) == [Outcome.FAIL]
    assert gates.agreement(None, GatesSpec()) == []
