"""The kernels-only prediction on the committed H200 A/B (reports/examples/h200-cutlass-vs-torch,
whose raw data is restored from git history): real H200 token streams, so here and not in the
unit layer (tests/unit/test_gemm_predict.py has the synthetic engine)."""

import json
import sys

import numpy as np
from conftest import ROOT, steps_rebuilt_and_counted

from vse.gemm import predict as gemm_predict
from vse.gemm.predict import rebuild_steps
from vse.models.sources import ARCHITECTURES
from vse.rundir.records import read_jsonl

sys.path.insert(0, str(ROOT / "benchmarks"))
from pack_example import unpack  # noqa: E402


def test_the_h200_ab_steps_and_prediction(tmp_path):
    """The committed H200 A/B (CUTLASS vs torch) with the committed H200 gemm-bench: every token is
    in a step, decode batches are the concurrency, and the kernels explain the throughput change
    within a few points (measured +2.73%)."""
    run = unpack(ROOT / "reports" / "examples" / "h200-cutlass-vs-torch", tmp_path)
    recs = read_jsonl(run / "baseline" / "bench-0.jsonl")
    st = rebuild_steps(recs)
    measured = [r for r in recs if r.phase == "measure" and r.success]
    assert (st.decode.sum() + sum(1 for _ in measured)) == sum(len(r.chunk_ns) for r in measured)
    assert np.median(st.decode) == 128 and st.prefill.sum() == sum(r.prompt_len for r in measured)
    gemm = json.loads((ROOT / "reports" / "examples" / "h200-gemm" / "gemm.json").read_text())
    cfg = ARCHITECTURES[next(a for a in ARCHITECTURES if a.value == "llama-3.1-8b")]
    pred, why = gemm_predict.for_run(cfg, 1, gemm, [recs], "cutlass", "torch", 128)
    assert why == "" and 0.2 < pred.gemm_share < 0.6
    assert 0.5 < pred.predicted_pct["output_throughput"] < 5


def test_the_h200_steps_rebuilt_match_vllms_own_count_in_every_run(tmp_path):
    """On the H200 (async scheduling, CUDA graphs, 3,100 steps per run) the rebuilt steps must
    still be vLLM's own steps (vllm:iteration_tokens_total): seen 1-47 apart per run (at most 1.5%:
    a step split or merged where arrivals straddle the gap), 3 apart on average over 16 runs."""
    run = unpack(ROOT / "reports" / "examples" / "h200-cutlass-vs-torch", tmp_path)
    diffs = []
    for meta, rebuilt, server in steps_rebuilt_and_counted(run):
        assert abs(rebuilt - server) <= 0.02 * server, (meta, rebuilt, server)
        diffs.append((rebuilt - server) / server)
    assert len(diffs) == 16 and abs(np.mean(diffs)) < 0.005, diffs
