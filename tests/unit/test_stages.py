"""A staged load: each stage's load for its time, every request recorded with its stage, every
metric stage by stage. Driven against benchmarks/reference_server.py (a scripted stream: the
client's own machinery, not a measurement of vLLM)."""

import pytest
from test_runner_processes import reference_server  # noqa: F401 (the fixture)

from vse.analysis.stages import stage_view
from vse.errors import ScenarioError
from vse.loadgen.client import RequestParams
from vse.loadgen.datasets import Prompt
from vse.loadgen.runner import LoadShape, run_load
from vse.orchestration.scenario_check import load_scenario
from vse.scenario import Stage


def test_each_stage_keeps_its_load_for_its_time(reference_server):  # noqa: F811
    stages = (Stage(duration_s=1.0, max_concurrency=2), Stage(duration_s=1.0, request_rate=20))
    prompts = [Prompt(i, f"req {i}", 2, 16) for i in range(200)]
    res = run_load(RequestParams(reference_server, "reference"), prompts, LoadShape(stages=stages, seed=1))
    recs = sorted(res.records, key=lambda r: r.send_ns)
    t0 = min(r.scheduled_ns for r in recs)
    first = [r for r in recs if r.stage == 0]
    second = [r for r in recs if r.stage == 1]
    assert len(first) + len(second) == len(recs) and all(r.success for r in recs)
    assert all(r.send_ns - t0 < 1.0e9 for r in first) and all(0.99e9 <= r.scheduled_ns - t0 < 2.0e9 for r in second)
    # concurrency 2: never more than two of the first stage in flight at once
    for r in first:
        assert sum(o.send_ns <= r.send_ns < o.end_ns for o in first) <= 2
    assert 8 <= len(first) <= 22, len(first)  # about 100 ms a request, two at a time
    assert 8 <= len(second) <= 35, len(second)  # Poisson at 20 req/s for a second
    assert [r.index for r in recs] == sorted(r.index for r in recs)  # the prompts in order


def test_stage_metrics_split_each_run_by_stage(reference_server):  # noqa: F811
    from types import SimpleNamespace

    from vse.rundir.rawdata import RepeatResult

    s = load_scenario(
        "scenarios/cpu-smoke.yaml",
        overrides=[
            "workload.max_concurrency=null",
            "workload.stages=[{duration_s: 0.5, request_rate: 10}, {duration_s: 0.5, max_concurrency: 4}]",
        ],
    )
    prompts = [Prompt(i, f"req {i}", 2, 8) for i in range(100)]
    res = run_load(RequestParams(reference_server, "reference"), prompts, LoadShape(stages=tuple(s.workload.stages)))
    arm = SimpleNamespace(raw=[RepeatResult(res.records, {})])
    rows = stage_view(s, {"baseline": arm})
    assert [r.stage for r in rows] == [0, 1] and rows[1].label == "concurrency 4 for 0.5 s"
    assert sum(r.requests for r in rows) == len(res.records)
    assert all(r.mean["median_ttft_ms"] > 15 and r.mean["output_throughput"] > 0 for r in rows)


@pytest.mark.parametrize(
    "overrides, why",
    [
        (["workload.stages=[{duration_s: 5}]"], "a stage sets request_rate or max_concurrency"),
        (["workload.stages=[{duration_s: 5, request_rate: 2}]"], "stages do not combine with workload.max_concurrency"),
        (
            [
                "workload.max_concurrency=null",
                "workload.client_processes=2",
                "workload.stages=[{duration_s: 5, request_rate: 2}]",
            ],
            "stages do not combine with workload.client_processes above 1",
        ),
    ],
)
def test_stages_that_cannot_run_are_refused(overrides, why):
    with pytest.raises(ScenarioError, match=why):
        load_scenario("scenarios/cpu-smoke.yaml", overrides=overrides)


def test_a_traffic_section_reads_the_same_in_html():
    from vse.report.html import from_markdown

    html = from_markdown(
        ["## Stages", "", "Each run's requests.", "", "| Arm | Stage |", "|---|---:|", "| baseline | 1 |", ""]
    )
    assert html == (
        "<h2>Stages</h2>\n<p>Each run&#x27;s requests.</p>\n"
        "<table><tr><th>Arm</th><th>Stage</th></tr><tr><td>baseline</td><td>1</td></tr></table>"
    )
