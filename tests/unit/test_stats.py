"""Statistics and decisions on simulated data with known answers.

The simulation model is the one the suite's intervals assume, fitted to the committed A/A
runs: a run-level log value = arm effect + server-start offset (sd sigma_start) + run noise
(sd sigma_run). Error rates are checked with binomial bounds over thousands of comparisons."""

import math

import numpy as np
import pytest
from scipy import stats as sps

from vse.stats import decide
from vse.stats.decide import GateInput, Outcome
from vse.stats.estimate import (
    Design,
    RepeatData,
    RunValue,
    Verdict,
    compare_arms,
    compare_values,
    disturbed_runs,
    estimate,
    metric_defs,
    t_quantile,
    t_sf,
    two_modes,
)

THROUGHPUT = next(m for m in metric_defs([99], False) if m.key == "output_throughput")
TPOT = next(m for m in metric_defs([99], False) if m.key == "median_tpot_ms")
# Per-start noise at least that of the committed H200 runs (the largest start-to-start spread
# there, median TPOT, was under 1%), with starts varying more than runs within a start.
SIGMA_START, SIGMA_RUN = 0.012, 0.005


def simulate(rng, n, starts, runs, effect=0.0, s_start=SIGMA_START, s_run=SIGMA_RUN):
    """n comparisons: arrays (n, starts, runs) of log values per arm."""

    def arm(mu):
        return mu + rng.normal(0, s_start, (n, starts, 1)) + rng.normal(0, s_run, (n, starts, runs))

    return arm(0.0), arm(effect)


def values(logs):
    return [RunValue(s, float(math.exp(v))) for s in range(logs.shape[0]) for v in logs[s]]


def gate_outcome(b, c, margin, alpha=0.05, higher=True):
    e = estimate(values(b), values(c))
    return decide.decide([GateInput("g", e, higher, margin)], alpha)[0].outcome


def binom_upper(k, n, conf=0.99):
    return float(sps.beta.ppf(conf, k + 1, n - k))


def test_the_simulated_noise_is_at_least_what_the_h200_showed():
    """The committed H200 runs (one or two runs per server start) give the start-to-start spread that
    the intervals must cover; the simulation's per-start noise must not be smaller, or the
    error rates below would be checked under easier conditions than the hardware's."""
    import json

    from conftest import ROOT

    sd = []
    for ex in ("h200-aa", "h200-cutlass-vs-torch"):
        res = json.loads((ROOT / f"reports/examples/{ex}/results.json").read_text())
        for row in res["comparison"]:
            if row["key"] in ("output_throughput", "median_tpot_ms"):
                for side in ("baseline", "candidate"):
                    # start means (runs averaged within their start, as the interval does)
                    by_start = {}
                    for v, st in zip(row[f"{side}_runs"], row[f"{side}_starts"]):
                        by_start.setdefault(st, []).append(math.log(v))
                    sd.append(float(np.std([np.mean(x) for x in by_start.values()], ddof=1)))
    assert len(sd) == 8 and max(sd) > 0
    assert math.hypot(SIGMA_START, SIGMA_RUN) >= max(sd), (max(sd), math.hypot(SIGMA_START, SIGMA_RUN))


def test_aa_false_positive_rate_is_at_most_alpha_over_2000_comparisons():
    rng = np.random.default_rng(1)
    n, hits_fail, hits_verdict = 2000, 0, 0
    b, c = simulate(rng, n, starts=2, runs=2)
    for i in range(n):
        r = compare_values(THROUGHPUT, values(b[i]), values(c[i]), 0.05)
        hits_verdict += r.verdict is not Verdict.NO_CHANGE
        hits_fail += gate_outcome(b[i], c[i], 0.0001) is Outcome.FAIL  # a tiny margin: FAIL = "worse"
    # exploratory verdicts: two-sided 5%; the 99% binomial upper bound of what we saw must allow 5%
    assert sps.binomtest(hits_verdict, n, 0.05, alternative="greater").pvalue > 0.01, hits_verdict / n
    assert hits_verdict / n < 0.05 + 3 * math.sqrt(0.05 * 0.95 / n)
    assert sps.binomtest(hits_fail, n, 0.025, alternative="greater").pvalue > 0.01, hits_fail / n


def test_a_regression_at_the_margin_passes_at_most_alpha_over_2():
    """Consumer risk: the candidate really is 3% slower (the margin); PASS must be rare."""
    rng = np.random.default_rng(2)
    n, passed = 2000, 0
    b, c = simulate(rng, n, starts=3, runs=2, effect=math.log(1 - 0.03))
    for i in range(n):
        passed += gate_outcome(b[i], c[i], 0.03) is Outcome.PASS
    assert sps.binomtest(passed, n, 0.025, alternative="greater").pvalue > 0.01, passed / n


def test_holm_keeps_false_failures_at_alpha_over_2_across_three_gated_metrics():
    """Three gated metrics each exactly at their margin (the worst case a candidate 'within every
    margin' can be): each FAIL test alone rejects about alpha/2 of the time, so without Holm any-FAIL
    would be about 7%; with it, at most alpha/2 (the old version passed with Holm removed)."""
    rng = np.random.default_rng(3)
    n, any_fail, margin = 3000, 0, 0.03
    for _ in range(n):
        gins = []
        for j in range(3):
            b, c = simulate(rng, 1, starts=3, runs=2, effect=math.log(1 - margin))
            gins.append(GateInput(f"g{j}", estimate(values(b[0]), values(c[0])), True, margin))
        any_fail += any(d.outcome is Outcome.FAIL for d in decide.decide(gins, 0.05))
    assert sps.binomtest(any_fail, n, 0.025, alternative="greater").pvalue > 0.01, any_fail / n


def power(shift, starts, n=400, seed=4):
    rng = np.random.default_rng(seed)
    b, c = simulate(rng, n, starts=starts, runs=2, effect=math.log(1 - shift))
    return np.mean(
        [compare_values(THROUGHPUT, values(b[i]), values(c[i]), 0.05).verdict is Verdict.WORSE for i in range(n)]
    )


def test_power_curves_grow_with_the_shift_and_the_starts():
    curve = {(s, k): power(s, k) for s in (0.02, 0.05, 0.10) for k in (2, 4)}
    for k in (2, 4):
        assert curve[(0.02, k)] <= curve[(0.05, k)] <= curve[(0.10, k)]
    for s in (0.02, 0.05, 0.10):
        assert curve[(s, 2)] <= curve[(s, 4)]
    assert curve[(0.10, 4)] > 0.95 and curve[(0.05, 4)] > 0.8 and curve[(0.02, 2)] < 0.5


def test_one_server_per_arm_is_optimistic_and_never_gates():
    """All runs of an arm on one server: the start offset is invisible to a spread across runs,
    so identical arms come out 'different' far more often than 5%. That is why it is a quick look."""
    rng = np.random.default_rng(5)
    n, flagged = 1000, 0
    b, c = simulate(rng, n, starts=1, runs=4)
    for i in range(n):
        r = compare_values(THROUGHPUT, values(b[i]), values(c[i]), 0.05)
        assert r.design is Design.QUICK_LOOK
        flagged += r.verdict is not Verdict.NO_CHANGE
    assert flagged / n > 0.3
    assert gate_outcome(b[0], c[0], 0.5) is Outcome.INCONCLUSIVE


def sequential(b, c, margin, looks, first=2):
    """Add a start per arm until decided or out of looks, spending alpha over the looks."""
    for k in range(1, looks + 1):
        s = first + k - 1
        e = estimate(values(b[:s]), values(c[:s]))
        out = decide.decide([GateInput("g", e, True, margin)], decide.spent_alpha(0.05, s, first, first + looks - 1))[
            0
        ].outcome
        if out is not Outcome.INCONCLUSIVE:
            return out
    return Outcome.INCONCLUSIVE


def test_sequential_stopping_keeps_both_error_rates():
    rng = np.random.default_rng(6)
    n, looks = 2000, 4
    bad_pass = good_fail = decided = 0
    at_margin_fail = 0
    b, c = simulate(rng, n, starts=2 + looks - 1, runs=2, effect=math.log(1 - 0.03))
    for i in range(n):
        out = sequential(b[i], c[i], 0.03, looks)
        bad_pass += out is Outcome.PASS
        at_margin_fail += out is Outcome.FAIL  # exactly at the margin is not beyond it: FAIL <= alpha/2
    b, c = simulate(rng, n, starts=2 + looks - 1, runs=2)
    for i in range(n):
        out = sequential(b[i], c[i], 0.03, looks)
        good_fail += out is Outcome.FAIL
        decided += out is Outcome.PASS
    assert sps.binomtest(bad_pass, n, 0.025, alternative="greater").pvalue > 0.01, bad_pass / n
    assert sps.binomtest(good_fail, n, 0.025, alternative="greater").pvalue > 0.01, good_fail / n
    assert sps.binomtest(at_margin_fail, n, 0.025, alternative="greater").pvalue > 0.01, at_margin_fail / n
    assert decided / n > 0.5  # and it does decide: identical arms mostly PASS a 3% margin
    assert sum(decide.spent_alpha(0.05, s, 2, 5) for s in range(2, 6)) == pytest.approx(0.05)
    assert decide.spent_alpha(0.05, 3, 3, 6) == pytest.approx(0.05 * 0.25)  # first look: (3/6)^2 of alpha
    assert decide.spent_alpha(0.05, 3, 3, None) == 0.05  # a fixed design spends it all at once


def test_three_outcomes_and_how_many_more_starts():
    def est(diff, se, n=2, var=0.0002):
        return decide.Estimate(diff, se, 2 * n - 2, Design.STARTS, n, n, var, var)

    pass_, fail_, open_ = decide.decide(
        [
            GateInput("p", est(0.0, 0.001), False, 0.05),
            GateInput("f", est(0.2, 0.001), False, 0.05),
            GateInput("i", est(0.03, 0.01), False, 0.05),
        ],
        0.05,
    )
    assert (pass_.outcome, fail_.outcome, open_.outcome) == (Outcome.PASS, Outcome.FAIL, Outcome.INCONCLUSIVE)
    assert open_.more_starts is not None and open_.more_starts > 0 and "more server start" in open_.detail
    # throughput: worse means lower
    (d,) = decide.decide([GateInput("t", est(math.log(0.9), 0.001), True, 0.05)], 0.05)
    assert d.outcome is Outcome.FAIL and d.worse == pytest.approx(0.1)


def test_holm_adjustment():
    assert decide.holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])


def test_disturbed_run_is_found_and_noise_is_not():
    assert disturbed_runs([10850, 10870, 10293, 10880, 10860, 10840]) == [2]
    rng = np.random.default_rng(7)
    assert disturbed_runs(list(10800 * (1 + rng.normal(0, 0.002, 8)))) == []


def test_bimodal_run_level_ttft_is_detected():
    assert two_modes([620, 650, 690, 930, 960, 980]).bimodal
    assert not two_modes([900, 910, 925, 930, 945, 960]).bimodal
    assert not two_modes([600, 900]).bimodal  # too few runs to say


def synth(rng, n=64, scale=1.0, tokens=32, start=0):
    ttft = rng.lognormal(np.log(300), 0.3, n) * scale
    itl = [rng.lognormal(np.log(20), 0.2, tokens - 1) * scale for _ in range(n)]
    e2el = ttft + np.array([a.sum() for a in itl])
    tpot = (e2el - ttft) / (tokens - 1)
    out = np.full(n, float(tokens))
    dur = float(e2el.max() / 1000 * 2) * scale
    return RepeatData(
        dur,
        ttft,
        tpot,
        e2el,
        out,
        out + 128,
        np.ones(n),
        itl,
        start=start,
        ttft_first=ttft[: n // 2],
        ttft_steady=ttft[n // 2 :],
    )


def test_compare_arms_on_request_data_finds_a_ten_percent_slowdown():
    rng = np.random.default_rng(8)
    b = [synth(rng, scale=rng.normal(1, 0.01), start=s) for s in range(3) for _ in range(2)]
    c = [synth(rng, scale=1.1 * rng.normal(1, 0.01), start=s) for s in range(3) for _ in range(2)]
    rows = {r.key: r for r in compare_arms(b, c, [99])}
    for key in ("median_ttft_ms", "mean_tpot_ms", "mean_e2el_ms", "median_ttft_first_wave_ms"):
        assert rows[key].design is Design.STARTS and rows[key].verdict is Verdict.WORSE, key
        assert rows[key].ci_low < 0.10 < rows[key].ci_high, key
    assert rows["output_throughput"].verdict is Verdict.WORSE
    assert rows["output_throughput"].n_base == 3


def test_an_excluded_run_leaves_its_start_counted():
    base = [RunValue(0, 100.0), RunValue(0, 101.0), RunValue(1, 50.0, excluded=True), RunValue(1, 100.5)]
    cand = [RunValue(0, 100.0), RunValue(1, 100.2)]
    r = compare_values(THROUGHPUT, base, cand, 0.05)
    assert r.n_base == 2 and abs(r.rel_change) < 0.01


def test_a_run_no_longer_than_one_wave_is_all_first_wave():
    """A run with no more requests than the concurrency limit (a sweep's high-concurrency point) is
    one burst into an idle server: all of it is the first wave (it had no first-wave TTFT at all,
    so the gate on it could never decide there: the H200 sweep's c128 point with 128 prompts)."""
    from vse.rundir.records import RequestRecord
    from vse.stats.estimate import repeat_data

    def rec(i: int, send_ms: int, ttft_ms: int) -> RequestRecord:
        t0 = send_ms * 1_000_000
        return RequestRecord(
            index=i,
            phase="measure",
            prompt_len=10,
            expected_output_len=2,
            scheduled_ns=0,
            send_ns=t0,
            chunk_ns=[t0 + ttft_ms * 1_000_000, t0 + (ttft_ms + 5) * 1_000_000],
            chunk_tokens=[1, 1],
            end_ns=t0 + (ttft_ms + 5) * 1_000_000,
            output_tokens=2,
            success=True,
        )

    burst = [rec(i, 0, 100 + i) for i in range(4)]
    one_wave = repeat_data(burst, first_wave=8)
    assert sorted(one_wave.ttft_first) == [100, 101, 102, 103] and len(one_wave.ttft_steady) == 0
    two_waves = repeat_data(burst + [rec(4 + i, 200, 50) for i in range(4)], first_wave=4)
    assert sorted(two_waves.ttft_first) == [100, 101, 102, 103] and list(two_waves.ttft_steady) == [50] * 4
    assert len(repeat_data(burst, first_wave=None).ttft_first) == 0  # an open-loop rate has no wave


def test_the_more_starts_estimate_uses_the_alpha_of_the_look_it_predicts_and_says_when_beyond_the_plan():
    e = decide.Estimate(0.03, 0.012, 4, Design.STARTS, 3, 3, 0.0004, 0.0004)
    (naive,) = decide.decide([GateInput("g", e, False, 0.05)], 0.0125)
    (strict,) = decide.decide([GateInput("g", e, False, 0.05)], 0.0125, lambda k: 0.001)
    assert strict.more_starts > naive.more_starts  # the later look's (smaller) alpha, not this one's
    spend = lambda k: decide.spent_alpha(0.05, k, 3, 6)
    (far,) = decide.decide([GateInput("g", e, False, 0.05)], spend(3), spend, max_starts=6)
    assert far.more_starts == 13 and "beyond the plan's 6 per arm" in far.detail


def test_the_fast_t_functions_are_scipys_bit_for_bit():
    """The gates' t quantile and tail probability skip scipy.stats.t's argument handling; every value,
    the edges included (df infinite, 0, negative, NaN), is what scipy.stats.t gives."""
    dfs = [*np.random.default_rng(0).uniform(0.5, 200, 300), 1.0, 2.0, 1e6, math.inf, math.nan, 0.0, -1.0]

    def same(a: float, b: float) -> bool:
        return a == b or (math.isnan(a) and math.isnan(b))

    for df in dfs:
        assert all(same(t_quantile(q, df), float(sps.t.ppf(q, df))) for q in (0.5, 0.975, 0.9875, 0.995))
        assert all(same(t_sf(x, df), float(sps.t.sf(x, df))) for x in (-3.0, -0.1, 0.0, 0.7, 5.0, 40.0))


def test_a_metric_key_is_defined_once_and_a_repeated_percentile_is_refused():
    """workload.percentiles [99, 99.0] would make p99_ttft_ms twice (twice in summary.md, results.json
    and the CSV): the scenario refuses it in one line, and the registry refuses any key defined twice."""
    from vse.errors import ScenarioError
    from vse.orchestration.scenario_check import load_scenario
    from vse.stats.registry import metric_defs

    keys = [m.key for m in metric_defs([90, 99.9], goodput=True, energy=True)]
    assert len(keys) == len(set(keys)) and "p99.9_ttft_ms" in keys and "p90_e2el_ms" in keys
    with pytest.raises(ValueError, match="metric keys defined twice: p99_e2el_ms"):
        metric_defs([99, 99.0], goodput=False)
    with pytest.raises(ScenarioError, match="percentile 99 is listed twice"):
        load_scenario("scenarios/cpu-smoke.yaml", overrides=["workload.percentiles=[90, 99, 99.0]"])


def test_no_metric_key_is_spelled_outside_the_registry():
    """A metric's key is a registry constant wherever code names it by hand (a default, a fixed
    column, a formula), so renaming or adding one touches the registry and its test only. The scan
    reads every string literal of the package; the keys defined below the registry (the
    scenario's first-wave checks, which the registry re-exports) are the exception."""
    import ast

    from conftest import ROOT

    from vse.stats import registry

    keys = {m.key for m in registry.metric_defs([50, 90, 99, 99.9], goodput=True, energy=True)}
    found = []
    for f in sorted((ROOT / "eval" / "vse").rglob("*.py")):
        if f.name == "registry.py":
            continue
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Constant) and node.value in keys:
                found.append(f"{f.relative_to(ROOT)}:{node.lineno} {node.value}")
    # the file and the key, not the line: an edit elsewhere in the file moves it
    assert [f.split(":")[0] + " " + f.split(" ")[1] for f in found] == [
        "eval/vse/scenario/__init__.py mean_decode_first_wave_ms",
        "eval/vse/scenario/__init__.py median_ttft_first_wave_ms",
        "eval/vse/scenario/__init__.py median_ttft_steady_ms",
    ], found
    assert registry.FIRST_WAVE_DECODE == "mean_decode_first_wave_ms"
