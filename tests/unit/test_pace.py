"""Whose pace the client read (eval/vse/analysis/pace.py): the decode gates are not decided where
the client's mean ITL per token parts from vLLM's own, engine-timestamped one."""

from types import SimpleNamespace

from test_gates import row

from vse.analysis import pace
from vse.scenario import GatesSpec, PerfGate
from vse.server.prometheus import delta
from vse.stats import gates, registry
from vse.stats.gates import Outcome


def arm(name, client_ms, server_ms):
    reps = [{registry.MEAN_ITL_TOKEN: c} for c in client_ms]
    return SimpleNamespace(name=name, repeats=reps, server_deltas=[{pace.SERVER_MEAN_ITL: s} for s in server_ms])


def test_the_server_mean_is_the_key_vllms_counters_give():
    d = delta({}, {"vllm:inter_token_latency_seconds_count": 1000.0, "vllm:inter_token_latency_seconds_sum": 4.5})
    assert d[pace.SERVER_MEAN_ITL] == 4.5


def test_a_client_that_keeps_pace_refuses_nothing():
    # as on the H100 (the 1.5B model at c128, half its tokens packed into multi-token chunks): +0.1-0.3%
    arms = {"baseline": arm("baseline", [4.50, 4.48], [4.49, 4.47]), "candidate": arm("candidate", [4.37], [4.36])}
    assert pace.off_pace(arms) is None
    assert pace.refused_metrics(pace.off_pace(arms), registry.metric_defs([99], False)) == {}
    # no per-token timing (usage_per_chunk off) or no scrape: nothing to hold it against, nothing refused
    assert (
        pace.off_pace({"baseline": arm("baseline", [None], [4.4]), "candidate": arm("candidate", [4.4], [None])})
        is None
    )


def test_a_client_behind_the_engine_refuses_the_decode_gates_only():
    arms = {"baseline": arm("baseline", [4.50], [4.49]), "candidate": arm("candidate", [4.70, 4.72], [4.40, 4.41])}
    why = pace.off_pace(arms)
    assert why and "candidate +6.9% over 2 run(s)" in why and "baseline" not in why and "--api-server-count" in why
    refused = pace.refused_metrics(pace.off_pace(arms), registry.metric_defs([99], False))
    assert {registry.FIRST_WAVE_DECODE, registry.MEDIAN_TPOT, registry.MEAN_ITL_TOKEN, registry.MEDIAN_ITL} <= set(
        refused
    )
    assert not {registry.OUTPUT_THROUGHPUT, registry.MEDIAN_TTFT_FIRST_WAVE} & set(refused)
    # the gate that would PASS is INCONCLUSIVE with the cause; throughput's gate is decided as before
    g = GatesSpec(
        performance=[
            PerfGate(metric=registry.FIRST_WAVE_DECODE, max_worse_pct=5),
            PerfGate(metric=registry.OUTPUT_THROUGHPUT, max_worse_pct=5),
        ]
    )
    rows = [row(registry.FIRST_WAVE_DECODE, -0.04), row(registry.OUTPUT_THROUGHPUT, 0.02, higher=True)]
    dec, tp = gates.performance(rows, g, 0.05, refused=refused)
    assert dec.outcome is Outcome.INCONCLUSIVE and "not decided: the client's mean ITL per token" in dec.detail
    assert tp.outcome is Outcome.PASS
    assert [r.outcome for r in gates.performance(rows, g, 0.05)] == [Outcome.PASS, Outcome.PASS]


def test_vllms_step_count_is_dropped_where_several_api_server_processes_kept_it():
    """Each API-server process counts the engine steps that carried its own requests: with two, one
    step counts up to twice (docs/measurements.md), so a run served that way has no step
    count for the readings built on it (decode mix, calibration truths, the GEMM prediction)."""
    from vse.analysis import load

    assert load.api_servers(["vllm", "serve", "m"]) == 1
    assert load.api_servers(["--api-server-count", "2"]) == 2 and load.api_servers(["--api-server-count=3"]) == 3
    assert load.api_servers(["-asc", "4", "--port", "8000"]) == 4
    delta = {
        "vllm:iteration_tokens_total_count": 6230.0,
        "vllm:iteration_tokens_total_sum": 1.0,
        pace.SERVER_MEAN_ITL: 5.6,
    }
    servers = [{"server": 0, "argv": ["serve"]}, {"server": 1, "argv": ["serve", "--api-server-count", "2"]}]
    one = load._engine_steps_only_where_counted({"server": 0, "server_metrics_delta": delta}, servers)
    two = load._engine_steps_only_where_counted({"server": 1, "server_metrics_delta": delta}, servers)
    assert one == delta
    assert two == {pace.SERVER_MEAN_ITL: 5.6}  # the per-request ITL stays: each request has one process
