"""Statistics on synthetic samples with known answers."""

import numpy as np
import pytest

from eval.stats import RepeatData, Verdict, compare_arms, compare_metric, metric_defs, noninferiority


def synth(rng, n=120, scale=1.0, tokens=64):
    ttft = rng.lognormal(np.log(300), 0.3, n) * scale
    itl = [rng.lognormal(np.log(20), 0.2, tokens - 1) * scale for _ in range(n)]
    e2el = ttft + np.array([a.sum() for a in itl])
    tpot = (e2el - ttft) / (tokens - 1)
    out = np.full(n, float(tokens))
    dur = float(e2el.max() / 1000 * 2)
    return RepeatData(dur, ttft, tpot, e2el, out, out + 128, np.ones(n), itl)


def arms(seed, scale_b=1.0, scale_c=1.0, repeats=3, jitter=0.01):
    rng = np.random.default_rng(seed)
    b = [synth(rng, scale=scale_b * rng.normal(1, jitter)) for _ in range(repeats)]
    c = [synth(rng, scale=scale_c * rng.normal(1, jitter)) for _ in range(repeats)]
    return b, c


def test_identical_distributions_give_no_change_at_the_stated_rate():
    trials, flagged, total = 40, 0, 0
    for k in range(trials):
        b, c = arms(1000 + k)
        rows = compare_arms(b, c, [99], b=300)
        flagged += sum(r.verdict != Verdict.NO_CHANGE for r in rows)
        total += len(rows)
    # alpha = 0.05; allow sampling slack over 40 x 15 correlated tests
    assert flagged / total < 0.10


def test_a_ten_percent_shift_is_detected_in_the_right_direction():
    b, c = arms(7, 1.0, 1.10)
    rows = {r.key: r for r in compare_arms(b, c, [99], b=500)}
    for key in ("median_ttft_ms", "mean_tpot_ms", "median_itl_ms", "mean_e2el_ms"):
        r = rows[key]
        assert r.verdict is Verdict.WORSE, key
        assert r.ci_low < 0.10 < r.ci_high or abs(r.rel_change - 0.10) < 0.03, key
    assert rows["output_throughput"].verdict is Verdict.BETTER or rows["output_throughput"].rel_change < 0
    b, c = arms(8, 1.10, 1.0)
    rows = {r.key: r for r in compare_arms(b, c, [99], b=500)}
    assert rows["median_tpot_ms"].verdict is Verdict.BETTER


def test_single_repeat_uses_request_bootstrap_and_leaves_throughput_open():
    b, c = arms(9, 1.0, 1.10, repeats=1)
    rows = {r.key: r for r in compare_arms(b, c, [99], b=500)}
    assert rows["median_tpot_ms"].method == "bootstrap" and rows["median_tpot_ms"].verdict is Verdict.WORSE
    assert rows["output_throughput"].verdict is Verdict.NOT_AVAILABLE


def test_itl_percentile_bootstrap_matches_exact_point():
    b, c = arms(11, repeats=1)
    m = next(d for d in metric_defs([99], False) if d.key == "p99_itl_ms")
    r = compare_metric(b, c, m, b=300)
    assert r.ci_low < r.rel_change < r.ci_high


@pytest.mark.parametrize("base,bse,cand,cse,margin,expect", [
    (0.80, 0.01, 0.80, 0.01, 0.05, True),   # equal and precise: shown non-inferior
    (0.80, 0.01, 0.70, 0.01, 0.05, False),  # a real drop beyond the margin
    (0.80, 0.05, 0.80, 0.05, 0.05, False),  # too noisy to show anything: not passed quietly
    (0.0, 0.0, 0.0, 0.0, 0.05, True),       # both exact zero
])
def test_noninferiority(base, bse, cand, cse, margin, expect):
    ok, _, text = noninferiority(base, bse, cand, cse, margin)
    assert ok is expect and "diff" in text
