"""The kernels-only prediction (eval/vse/gemm/predict.py): engine steps rebuilt from token streams,
GEMM time interpolated from gemm.json, and the predicted end-to-end change."""

import sys

import numpy as np
import pytest
from conftest import ROOT

from vse.gemm import predict as gemm_predict
from vse.gemm.predict import GemmTable, predict, rebuild_steps
from vse.models.sources import ARCHITECTURES
from vse.rundir.records import RequestRecord

sys.path.insert(0, str(ROOT / "benchmarks"))

MS = 1_000_000  # ns


def engine(n_req=24, conc=8, out_len=20, prompt=100, step_ms=10.0, prefill_per_step=4, jitter_us=30, seed=0):
    """A closed-loop engine: `conc` requests in flight; each step prefills up to `prefill_per_step`
    sent requests (their first token comes out of that step) and gives every running request one
    token; a finished request's slot sends the next prompt. Chunks of one step arrive `jitter_us`
    apart. Returns the records and the true (decode, prefill) tokens of every step."""
    rng = np.random.default_rng(seed)
    recs = [
        RequestRecord(
            index=i, phase="measure", prompt_len=prompt, expected_output_len=out_len, scheduled_ns=0, success=True
        )
        for i in range(n_req)
    ]
    pending, backlog, running, t, truth = list(range(conc)), list(range(conc, n_req)), [], 1_000 * MS, []
    while pending or running:
        admit, pending = pending[:prefill_per_step], pending[prefill_per_step:]
        emit = running + admit
        for j, i in enumerate(rng.permutation(emit)):
            recs[i].chunk_ns.append(t + j * jitter_us * 1000)
        truth.append((len(running), prompt * len(admit)))
        running = [i for i in emit if len(recs[i].chunk_ns) < out_len]
        for i in emit:
            if len(recs[i].chunk_ns) == out_len:
                recs[i].end_ns, recs[i].output_tokens = recs[i].chunk_ns[-1] + 100_000, out_len
                if backlog:
                    nxt = backlog.pop(0)
                    recs[nxt].send_ns = recs[nxt].scheduled_ns = recs[i].end_ns
                    pending.append(nxt)
        t += int(step_ms * MS)
    return recs, truth


def table(base_us: float, cand_us: float, ms=(1, 8, 64, 512, 4096)) -> dict:
    """gemm.json with time linear in M for one shape: us(M) = t * (1 + M / 512)."""
    return {
        "results": [
            {"backend": b, "shape": "qkv", "k": 64, "n": 64, "m": m, "us": t * (1 + m / 512)}
            for b, t in (("cutlass", base_us), ("torch", cand_us))
            for m in ms
        ]
    }


def test_steps_are_rebuilt_exactly_from_a_simulated_engine():
    recs, truth = engine()
    st = rebuild_steps(recs)
    assert len(st.t_ns) == len(truth)
    assert st.decode.tolist() == [d for d, _ in truth] and st.prefill.tolist() == [p for _, p in truth]
    assert np.allclose(st.durations_s, 0.010)


def test_a_coarser_or_finer_gap_gets_the_steps_wrong():
    """The check above can fail: a gap wider than a step merges steps, one below the jitter splits them."""
    recs, truth = engine()
    assert len(rebuild_steps(recs, gap_s=0.015).t_ns) < len(truth) < len(rebuild_steps(recs, gap_s=0.00001).t_ns)


def test_interpolation_is_linear_inside_and_proportional_beyond_the_grid():
    t = GemmTable(table(10.0, 5.0))
    assert t.layer_us("cutlass", np.array([8.0]))[0] == pytest.approx(10 * (1 + 8 / 512))
    assert t.layer_us("cutlass", np.array([36.0]))[0] == pytest.approx(10 * (1 + 36 / 512))
    assert t.layer_us("cutlass", np.array([8192.0]))[0] == pytest.approx(10 * (1 + 4096 / 512) * 2)


def test_identical_kernels_predict_no_change_and_faster_ones_the_computed_change():
    recs, truth = engine()
    same = predict([recs], table(10.0, 10.0), "cutlass", "torch", layers=4, first_wave=8)
    assert all(v == pytest.approx(0, abs=1e-9) for v in same.predicted_pct.values())
    p = predict([recs], table(100.0, 50.0), "cutlass", "torch", layers=4, first_wave=8)
    # decode-only steps of 8 running requests: GEMM time 4 layers x 100 us x (1 + 8/512) = 406 us of
    # 10 ms; halved: the decode step, hence ITL, shrinks by 2.03%
    assert p.predicted_pct["median_itl_ms"] == pytest.approx(-100 * 0.5 * 4 * 100e-6 * (1 + 8 / 512) / 0.010, rel=1e-6)
    assert p.gemm_share_decode == pytest.approx(4 * 100e-6 * (1 + 8 / 512) / 0.010, rel=1e-6)
    assert p.predicted_pct["output_throughput"] > 0 > p.predicted_pct["median_tpot_ms"]
    assert p.predicted_pct["median_ttft_first_wave_ms"] < 0
    assert p.decode_batch_median == 8 and p.steps_per_run == len(truth)


def test_a_prediction_needs_matching_shapes_and_both_backends():
    cfg = ARCHITECTURES[next(iter(ARCHITECTURES))]
    recs, _ = engine()
    pred, why = gemm_predict.for_run(cfg, 1, table(10.0, 5.0), [recs], "cutlass", "torch", 8)
    assert pred is None and "other shapes" in why
    with pytest.raises(ValueError, match="no timings for backend 'flashinfer'"):
        predict([recs], table(10.0, 5.0), "cutlass", "flashinfer", 4, 8)


def test_runs_without_a_successful_request_give_a_reason_not_a_crash():
    recs, _ = engine()
    for r in recs:
        r.success = False
    pred, why = gemm_predict.for_run(None, 1, table(1, 1), [recs], "cutlass", "torch", 8)
    assert pred is None and "config.json" in why
    with pytest.raises(ValueError, match="no successful measured request"):
        predict([recs], table(10.0, 5.0), "cutlass", "torch", 4, 8)
