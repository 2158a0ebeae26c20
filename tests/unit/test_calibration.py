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
    assert m6 < m3
    # 3 + 3 starts, df 4: (t_.975 + t_.80) x sqrt(2/3) x 1%
    from scipy import stats as sps

    assert m3 == pytest.approx(math.expm1((sps.t.ppf(0.975, 4) + sps.t.ppf(0.8, 4)) * math.sqrt(2 * v / 3)), rel=1e-9)
    assert math.isnan(cal.mde(v, v, 1, 0.05))
