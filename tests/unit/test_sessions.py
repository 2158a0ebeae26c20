"""Multi-turn sessions: each turn after its session's previous answer and think time, with every
earlier turn and answer before it; a failed turn ends its session, its later turns recorded as not
sent; the plan the same in every run; TTFT by turn index. Driven against
benchmarks/reference_server.py (a scripted stream: the client's machinery, not vLLM's speed)."""

import json
from types import SimpleNamespace

import pytest
from conftest import needs_tokenizer
from test_runner_processes import reference_server  # noqa: F401 (the fixture)

from vse.analysis.turns import turn_view
from vse.errors import ScenarioError
from vse.loadgen.client import RequestParams
from vse.loadgen.datasets import Prompt, build_prompts
from vse.loadgen.runner import LoadShape, run_load
from vse.orchestration.scenario_check import load_scenario
from vse.rundir.rawdata import RepeatResult
from vse.scenario import DatasetSpec
from vse.scenario import sessions as sessions_mod


def turns(session: int, texts: list[str], think: float = 0.05, out: int = 4, start: float = 0.0) -> list[Prompt]:
    return [
        Prompt(
            0,
            t,
            len(t.split()),
            out,
            start if i == 0 else None,
            session=session,
            turn=i,
            think_s=None if i == 0 else think,
        )
        for i, t in enumerate(texts)
    ]


def test_each_turn_follows_its_answer_with_the_history_before_it(reference_server):  # noqa: F811
    ps = turns(0, ["hello there", "and then", "last one"]) + turns(1, ["other chat", "more"], start=0.1)
    ps = [
        Prompt(i, p.text, p.prompt_len, p.output_len, p.arrival_s, session=p.session, turn=p.turn, think_s=p.think_s)
        for i, p in enumerate(ps)
    ]
    seen: list[str] = []

    def count(text: str) -> int:
        seen.append(text)
        return len(text.split())

    res = run_load(RequestParams(reference_server, "reference"), ps, LoadShape(), count_tokens=count)
    recs = {(r.session, r.turn): r for r in res.records}
    assert len(recs) == 5 and all(r.success for r in recs.values())
    for s, n in ((0, 3), (1, 2)):
        for t in range(1, n):  # sent after the previous answer ended and the think time
            assert recs[(s, t)].scheduled_ns >= recs[(s, t - 1)].end_ns + 0.05e9 - 1e6
    assert recs[(1, 0)].send_ns - recs[(0, 0)].send_ns >= 0.09e9  # the second session starts later
    # turn 3's text is turn 1, its answer, turn 2, its answer, then turn 3
    third = next(t for t in seen if t.endswith("last one"))
    assert third.startswith("hello there[rid=") and "and then[rid=" in third
    assert recs[(0, 2)].prompt_len > recs[(0, 1)].prompt_len > recs[(0, 0)].prompt_len == 2


def test_a_failed_turn_ends_its_session(reference_server):  # noqa: F811
    ps = turns(0, ["a", "b", "c"])
    ps = [
        Prompt(i, p.text, 1, 0 if i == 1 else 4, p.arrival_s, session=0, turn=p.turn, think_s=p.think_s)
        for i, p in enumerate(ps)
    ]
    res = run_load(RequestParams(reference_server, "reference"), ps, LoadShape())
    by = {r.turn: r for r in res.records}
    assert by[0].success and not by[1].success and not by[2].success
    assert by[2].error == "not sent: turn 1 of its session failed" and len(res.records) == 3


def test_the_plan_is_the_same_in_every_run_and_refuses_a_wrong_count(tmp_path):
    d = DatasetSpec(kind="sessions", sessions={"count": 5, "min_turns": 1, "max_turns": 4, "think_s": 2.0, "rate": 1.0})
    a, b = sessions_mod.plan(d), sessions_mod.plan(d.model_copy(update={"seed": 7}))
    assert a == b and all(1 <= p.turns <= 4 for p in a) and a[0].start_s == 0 < a[1].start_s
    assert all(len(p.think_s) == p.turns - 1 for p in a)
    sc = tmp_path / "s.yaml"
    sc.write_text(
        "name: t\nmodel: {id: /x, served_name: m}\narms: {baseline: {label: a}, candidate: {label: b}}\n"
        "workload: {dataset: {kind: sessions, sessions: {count: 5}}}\n"
    )
    s = load_scenario(sc)
    assert s.workload.num_prompts == sum(p.turns for p in sessions_mod.plan(s.workload.dataset))
    with pytest.raises(ScenarioError, match="num_prompts is 3, but the sessions have"):
        load_scenario(sc, overrides=["workload.num_prompts=3"])


def test_a_conversation_file_with_a_bad_line_is_refused_naming_it(tmp_path):
    f = tmp_path / "c.jsonl"
    f.write_text(
        json.dumps({"turns": ["hi", "more"]})
        + "\n"
        + json.dumps({"messages": [{"role": "system", "content": "x"}]})
        + "\n"
    )
    with pytest.raises(ScenarioError, match=r"c\.jsonl:2: a conversation is"):
        load_scenario(
            "scenarios/cpu-smoke.yaml",
            overrides=[
                f"workload.dataset={{kind: sessions, path: {f}, sessions: {{count: 5}}}}",
                "workload.num_prompts=2",
            ],
        )


@needs_tokenizer
def test_generated_and_file_sessions_build_every_turn(tmp_path, tokenizer_dir):
    d = DatasetSpec(kind="sessions", input_len=12, output_len=6, sessions={"count": 3, "min_turns": 2, "max_turns": 2})
    ps = build_prompts(d, 6 + 1, tokenizer_dir, warmup=1)
    assert [(p.session, p.turn) for p in ps[:6]] == [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1)]
    assert all(p.prompt_len == 12 for p in ps[:6]) and ps[6].session is None  # the warm-up: a single prompt
    f = tmp_path / "c.jsonl"
    f.write_text(
        json.dumps(
            {
                "messages": [
                    {"role": "user", "content": "What is 2+2?"},
                    {"role": "assistant", "content": "4"},
                    {"role": "user", "content": "And 3+3?"},
                ]
            }
        )
        + "\n"
    )
    ps = build_prompts(d.model_copy(update={"path": str(f)}), 2, tokenizer_dir)
    assert [p.text for p in ps] == ["What is 2+2?", "And 3+3?"]


def test_ttft_by_turn_index(reference_server):  # noqa: F811
    ps = turns(0, ["a b", "c"]) + turns(1, ["d", "e"])
    ps = [
        Prompt(i, p.text, p.prompt_len, 4, p.arrival_s, session=p.session, turn=p.turn, think_s=0.01)
        for i, p in enumerate(ps)
    ]
    res = run_load(RequestParams(reference_server, "reference"), ps, LoadShape())
    s = load_scenario(
        "scenarios/cpu-smoke.yaml",
        overrides=[
            "workload.dataset={kind: sessions, sessions: {count: 2, min_turns: 2, max_turns: 2}}",
            "workload.num_prompts=4",
        ],
    )
    rows = turn_view(s, {"baseline": SimpleNamespace(raw=[RepeatResult(res.records, {})])})
    assert [(r.turn, r.requests) for r in rows] == [(1, 2), (2, 2)] and all(r.median_ttft_ms >= 19 for r in rows)
