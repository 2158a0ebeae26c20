import math

import pytest

from vse.rundir.records import RequestRecord
from vse.stats import metrics

MS = 1_000_000


def rec(i, send_ms, chunks_ms, tokens=None, ok=True, phase="measure"):
    r = RequestRecord(
        index=i,
        phase=phase,
        prompt_len=10,
        expected_output_len=4,
        scheduled_ns=0,
        send_ns=send_ms * MS,
        chunk_ns=[c * MS for c in chunks_ms],
        chunk_tokens=tokens or [1] * len(chunks_ms),
        end_ns=(chunks_ms[-1] + 1) * MS if chunks_ms else 0,
        success=ok,
    )
    r.output_tokens = sum(r.chunk_tokens) if ok else 0
    return r


def test_hand_computed_values():
    # request 0: sent at 0, tokens at 100, 110, 130, 160 ms -> TTFT 100, ITLs 10/20/30, E2E 160, TPOT 60/3 = 20
    # request 1: sent at 0, tokens at 200, 210 (second chunk carries 3 tokens) -> TTFT 200, ITL 10, TPOT 10/3
    rs = [
        rec(0, 0, [100, 110, 130, 160]),
        rec(1, 0, [200, 210], tokens=[1, 3]),
        rec(2, 0, [50], ok=False),
        rec(3, 0, [5, 6], phase="warmup"),
    ]
    m = metrics.compute(rs, [99], max_concurrency=2)
    assert m["completed"] == 2 and m["failed"] == 1
    assert m["total_output_tokens"] == 8 and m["total_input_tokens"] == 20
    assert m["mean_ttft_ms"] == pytest.approx(150) and m["median_ttft_ms"] == pytest.approx(150)
    assert m["mean_tpot_ms"] == pytest.approx((20 + 10 / 3) / 2)
    assert m["mean_itl_ms"] == pytest.approx((10 + 20 + 30 + 10) / 4)
    assert m["median_itl_ms"] == pytest.approx(15)  # 10, 10, 20, 30
    assert m["mean_e2el_ms"] == pytest.approx((160 + 210) / 2)
    # duration: first scheduled (0) to last stream end of a measured request (211 ms)
    assert m["duration"] == pytest.approx(0.211)
    assert m["output_throughput"] == pytest.approx(8 / 0.211)
    assert m["chunks_per_token"] == pytest.approx(6 / 8)
    assert m["errors"].count("") == 3
    # its per-request arrays are exactly those it names (results.json leaves them out by that name)
    assert {k for k, v in m.items() if isinstance(v, list)} == set(metrics.PER_REQUEST)


def test_goodput():
    from vse.scenario import Goodput

    rs = [rec(0, 0, [100, 110, 130, 160]), rec(1, 0, [200, 210], tokens=[1, 3])]
    m = metrics.compute(rs, [99], goodput=Goodput(ttft_ms=150))
    assert m["request_goodput"] == pytest.approx(1 / m["duration"])


def test_vllm_block_layout():
    rs = [rec(0, 0, [100, 110, 130, 160]), rec(1, 0, [200, 210], tokens=[1, 3])]
    m = metrics.compute(rs, [99], max_concurrency=128)
    block = metrics.vllm_block(m, [99]).splitlines()
    assert block[0] == "============ Serving Benchmark Result ============"
    assert block[1].startswith("Successful requests:") and len(block[1].rstrip()) <= 51
    assert "Maximum request concurrency:             128" in "\n".join(block)
    heads = [ln for ln in block if ln.startswith("-")]
    assert heads == [
        "---------------Time to First Token----------------",
        "-----Time per Output Token (excl. 1st token)------",
        "---------------Inter-token Latency----------------",
    ]
    assert any(ln.startswith("P99 TTFT (ms):") for ln in block)
    assert block[-1] == "=" * 50
    assert all(len(ln) == 51 or ln.startswith("=") or ln.startswith("-") for ln in block[1:-1])


def test_no_successful_requests_is_not_a_crash():
    m = metrics.compute([rec(0, 0, [50], ok=False)], [99])
    assert m["completed"] == 0 and m["failed"] == 1 and not math.isnan(m["mean_ttft_ms"])


def test_peak_concurrency_is_exact_and_input_tokens_come_from_usage():
    from vse.rundir.records import RequestRecord
    from vse.stats.metrics import compute

    s = 1_000_000_000
    recs = []
    for i in range(16):  # a limit of 8: two back-to-back waves of 8, each 0.6 s long, across a second boundary
        start = (i // 8) * int(0.6 * s) + int(0.5 * s)
        recs.append(
            RequestRecord(
                index=i,
                phase="measure",
                prompt_len=10,
                expected_output_len=2,
                scheduled_ns=0,
                send_ns=start,
                chunk_ns=[start + int(0.3 * s), start + int(0.6 * s)],
                chunk_tokens=[1, 1],
                end_ns=start + int(0.6 * s),
                output_tokens=2,
                usage_prompt_tokens=12,
                success=True,
            )
        )
    m = compute(recs, [99], max_concurrency=8)
    assert m["max_concurrent_requests"] == 8  # exact: the suite's own figure (its block shows it)
    assert m["vllm_max_concurrent_requests"] == 16  # vLLM's per-second buckets, for its result file
    assert m["total_input_tokens"] == 16 * 12 and set(m["input_lens"]) == {12}


def test_client_processes_share_the_whole_concurrency():
    from vse.loadgen.runner import share

    assert [share(10, 3, i) for i in range(3)] == [4, 3, 3]
    assert sum(share(128, 5, i) for i in range(5)) == 128 and share(2, 4, 3) == 1
