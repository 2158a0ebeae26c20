"""Calibration truths and the minimum detectable effect: pure functions, hand-computed values."""

import math

import pytest

from vse.stats import calibration as cal

B = cal.BaselineFacts(
    decode_ms={"tmean_itl_token_ms": 10.0, "median_tpot_ms": 11.0},
    durations_s=[36.0, 36.0],
    engine_steps=[3600.0, 3600.0],
    ttft_first_wave_ms=1000.0,
    first_wave=128,
    input_len=1024,
    max_num_batched_tokens=8192,
)


def test_truths_follow_from_the_planted_work_and_the_baseline():
    p = cal.Planted(gpu_ms=0.8, cpu_ms=0.0, steps="all")
    assert cal.truth("tmean_itl_token_ms", p, B) == pytest.approx(0.08)
    assert cal.truth("median_tpot_ms", p, B) == pytest.approx(0.8 / 11)
    # 3600 steps x 0.8 ms = 2.88 s more on a 36 s run
    assert cal.truth("output_throughput", p, B) == pytest.approx(36 / 38.88 - 1)
    # the median first-wave request waits for half the wave's 16 prefill chunks: 8 x 0.8 ms on 1 s
    assert cal.truth("median_ttft_first_wave_ms", p, B) == pytest.approx(0.0064)
    assert cal.truth("p99_ttft_ms", p, B) is None


def test_a_prefill_only_slowdown_leaves_decode_alone():
    p = cal.Planted(gpu_ms=0.8, cpu_ms=0.0, steps="prefill")
    assert cal.truth("tmean_itl_token_ms", p, B) == 0.0
    assert cal.truth("median_ttft_first_wave_ms", p, B) == pytest.approx(0.0064)
    assert cal.truth("output_throughput", p, B) is None  # not every step: no formula


def test_minimum_detectable_effect_shrinks_with_starts_and_noise():
    v = math.log1p(0.01) ** 2  # 1% start-to-start sd per arm
    m3, m6 = cal.mde(v, v, 3, 0.05), cal.mde(v, v, 6, 0.05)
    assert m6 < m3 < cal.mde(4 * v, 4 * v, 3, 0.05)
    assert cal.mde(v, v, 3, 0.0125) > m3  # a look that spends less alpha
    from scipy import stats as sps

    def textbook(k, alpha):  # (t_{1-a/2} + t_{0.8}) x SE at Welch's df for known, equal variances
        df = 2 * k - 2
        return math.expm1((sps.t.ppf(1 - alpha / 2, df) + sps.t.ppf(0.8, df)) * math.sqrt(2 * v / k))

    # With many starts the variance estimate is nearly exact and the textbook formula holds; with
    # few, estimating it costs power and the textbook names too small a change (power: test_operating)
    assert cal.mde(v, v, 200, 0.05) == pytest.approx(textbook(200, 0.05), rel=0.01)
    assert m3 > 1.05 * textbook(3, 0.05)
    assert cal.mde(v, v, 3, 0.0125) > 1.3 * textbook(3, 0.0125)
    assert cal.mde(v, v, 3, 0.05) == cal.mde(v, v, 3, 0.05)  # seeded draws: a report rebuilds identically
    assert cal.mde(0.0, 0.0, 3, 0.05) == 0.0
    assert math.isnan(cal.mde(v, v, 1, 0.05))
