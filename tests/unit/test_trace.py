"""A replayed trace: its reading (one line naming the file, the line and the problem), its window
and lengths, prompts built from its block hashes (equal hashes equal tokens), the schedule the
client keeps, and the prefix reuse it implies."""

import gzip
import json
from pathlib import Path

import numpy as np
import pytest
from conftest import needs_tokenizer

from vse.analysis.replay import PromptBlocks, implied_hits, send_lag_ms
from vse.errors import ScenarioError
from vse.loadgen.datasets import WARMUP_BLOCKS, build_prompts, load_tokenizer, save_prompts
from vse.loadgen.runner import LoadShape, schedule
from vse.orchestration.scenario_check import load_scenario
from vse.rundir.records import RequestRecord
from vse.scenario import trace as trace_mod

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "eval/vse/data/mooncake/conversation-0-300s.jsonl.gz"


def rows(*reqs) -> str:
    return "".join(
        json.dumps({"timestamp": t, "input_length": n, "output_length": o, "hash_ids": h}) + "\n" for t, n, o, h in reqs
    )


def scenario(tmp_path: Path, trace_text: str, extra: str = "", server: str = "max_model_len: 2048") -> Path:
    (tmp_path / "t.jsonl").write_text(trace_text)
    p = tmp_path / "s.yaml"
    p.write_text(
        f"""
name: t
model: {{id: /nonexistent-ok-at-load-time, served_name: m}}
server: {{{server}}}
arms:
  baseline: {{label: a, backend: none}}
  candidate: {{label: b, backend: none}}
workload:
  dataset:
    kind: trace
    path: {tmp_path / "t.jsonl"}
    trace: {{block_tokens: 4{extra}}}
"""
    )
    return p


GOOD = rows((0, 6, 2, [0, 1]), (1000, 8, 3, [0, 2]), (2500, 3, 1, [3]))


def test_a_trace_scenario_replays_its_window_with_its_request_count(tmp_path):
    s = load_scenario(scenario(tmp_path, GOOD))
    assert s.workload.num_prompts == 3 and s.workload.dataset.trace.max_len == 2048
    w = trace_mod.window(s.workload.dataset)
    assert [r.arrival_s for r in w.requests] == [0.0, 1.0, 2.5]
    s = load_scenario(scenario(tmp_path, GOOD, ", start_s: 0.5, duration_s: 2, time_scale: 0.5"))
    w = trace_mod.window(s.workload.dataset)
    assert [(r.line, r.arrival_s) for r in w.requests] == [(2, 0.25)] and s.workload.num_prompts == 1


@pytest.mark.parametrize(
    "text, why",
    [
        (GOOD + "{not json\n", r"t\.jsonl:4: not JSON"),
        (rows((0, 6, 2, [0, 1]), (-5, 3, 1, [3])), r"t\.jsonl:2: timestamp -5 is not a number"),
        (
            rows((1000, 6, 2, [0, 1]), (500, 3, 1, [3])),
            r"t\.jsonl:2: timestamp 500 ms goes back from 1000 ms on line 1",
        ),
        (rows((0, 6, 2, [0])), r"t\.jsonl:1: 1 hash_ids for 6 input tokens; blocks of 4 tokens need 2"),
        ('{"timestamp": 0, "input_length": 4, "hash_ids": [0]}\n', r"t\.jsonl:1: no 'output_length'"),
        ("", r"t\.jsonl: the trace has no request"),
    ],
)
def test_bad_trace_lines_are_refused_naming_file_and_line(tmp_path, text, why):
    with pytest.raises(ScenarioError, match=why):
        load_scenario(scenario(tmp_path, text))


def test_an_empty_window_and_too_long_requests_are_refused_before_any_server(tmp_path):
    with pytest.raises(ScenarioError, match=r"the window 10 s to 12 s holds no request \(the trace spans 0-2.5 s"):
        load_scenario(scenario(tmp_path, GOOD, ", start_s: 10, duration_s: 2"))
    long = rows((0, 6, 2, [0, 1]), (10, 3000, 100, list(range(750))))
    with pytest.raises(
        ScenarioError, match=r"t\.jsonl:2: 3000 \+ 100 tokens .* do not fit max_len 2048.*length_policy"
    ):
        load_scenario(scenario(tmp_path, long))
    with pytest.raises(ScenarioError, match=r"num_prompts is 5, but the trace's window holds 3 requests"):
        load_scenario(_with(tmp_path, GOOD, "num_prompts: 5"))
    with pytest.raises(ScenarioError, match=r"length_policy cap needs a context"):
        load_scenario(scenario(tmp_path, GOOD, ", length_policy: cap", server="device: cpu"))


def _with(tmp_path: Path, text: str, workload_line: str) -> Path:
    p = scenario(tmp_path, text)
    p.write_text(p.read_text().replace("workload:\n", f"workload:\n  {workload_line}\n"))
    return p


def test_length_policies_count_what_they_changed(tmp_path):
    long = rows((0, 6, 2, [0, 1]), (10, 3000, 100, list(range(100, 850))), (20, 2040, 20, list(range(900, 1410))))
    s = load_scenario(scenario(tmp_path, long, ", length_policy: cap"))
    w = trace_mod.window(s.workload.dataset)
    assert (w.capped, w.dropped) == (2, 0)
    assert all(r.input_len + r.output_len <= 2047 for r in w.requests)
    assert w.requests[1].input_len == 2044 and len(w.requests[1].hash_ids) == 511  # leading whole blocks
    assert w.requests[2].input_len == 2040 and w.requests[2].output_len == 7  # output cut
    s = load_scenario(scenario(tmp_path, long, ", length_policy: drop"))
    w = trace_mod.window(s.workload.dataset)
    assert (w.capped, w.dropped, len(w.requests), s.workload.num_prompts) == (0, 2, 1, 1)
    s = load_scenario(scenario(tmp_path, long, ", length_policy: cap, length_scale: 0.5"))
    w = trace_mod.window(s.workload.dataset)
    assert w.block_len == 2 and w.scaled == 3 and [r.input_len for r in w.requests[:1]] == [3]
    with pytest.raises(ScenarioError, match=r"block_tokens x length_scale is 1.2"):
        load_scenario(scenario(tmp_path, long, ", length_scale: 0.3"))


def test_the_shipped_window_is_mooncakes_first_300_seconds():
    with gzip.open(SHIPPED, "rt") as f:
        lines = f.read().splitlines()
    assert len(lines) == 918 and json.loads(lines[-1])["timestamp"] < 300_000
    s = load_scenario(ROOT / "scenarios" / "cpu-trace-smoke.yaml")
    assert s.workload.dataset.path == str(SHIPPED) and s.workload.num_prompts == 87


@needs_tokenizer
def test_equal_hashes_give_equal_token_blocks_and_different_hashes_different(tmp_path, tokenizer_dir):
    text = rows((0, 40, 2, [7, 8, 9]), (5, 36, 2, [7, 8, 10]), (9, 20, 2, [11, 8]))
    s = load_scenario(scenario(tmp_path, text, ", block_tokens: 16"))
    d = s.workload.dataset
    ps = build_prompts(d, 4, tokenizer_dir, warmup=1)
    tok = load_tokenizer(tokenizer_dir)
    ids = [tok.encode(p.text, add_special_tokens=False).ids for p in ps]
    assert [len(i) for i in ids] == [40, 36, 20, 40]  # exact lengths, warm-up last
    assert ids[0][:32] == ids[1][:32] and ids[0][32:36] != ids[1][32:36]  # blocks 7, 8 shared; 9 vs 10 not
    assert ids[2][16:20] == ids[0][16:20] and ids[2][:16] != ids[0][:16]  # block 8's first tokens, after 11
    assert ps[3].hash_ids[0] >= WARMUP_BLOCKS and ids[3][:16] != ids[0][:16]  # warm-up shares no block
    assert [p.arrival_s for p in ps] == [0.0, 0.005, 0.009, None]
    again = build_prompts(d, 4, tokenizer_dir, warmup=1)
    other = build_prompts(d.model_copy(update={"seed": 1}), 4, tokenizer_dir, warmup=1)
    assert again == ps and other[0].text[:50] != ps[0].text[:50]  # the seed's, and run k's own
    sha = save_prompts(tmp_path / "p.jsonl", ps)
    assert sha and '"hash_ids": [7, 8, 9]' in (tmp_path / "p.jsonl").read_text()


def test_random_prompts_files_keep_no_trace_fields(tmp_path):
    from vse.loadgen.datasets import Prompt

    save_prompts(tmp_path / "p.jsonl", [Prompt(0, "hi", 1, 2)])
    assert json.loads((tmp_path / "p.jsonl").read_text()) == {
        "index": 0,
        "text": "hi",
        "prompt_len": 1,
        "output_len": 2,
    }


def test_the_client_keeps_the_traces_schedule_not_the_rate():
    from vse.loadgen.datasets import Prompt

    traced = [Prompt(i, "x", 1, 1, arrival_s=a, hash_ids=[i], block_len=1) for i, a in enumerate([0.0, 0.5, 2.0])]
    assert schedule(traced, LoadShape(request_rate=100.0)).tolist() == [0.0, 0.5, 2.0]
    plain = [Prompt(i, "x", 1, 1) for i in range(3)]
    assert schedule(plain, LoadShape()).tolist() == [0.0, 0.0, 0.0]


def test_implied_reuse_counts_leading_shared_blocks_in_the_servers_blocks():
    ps = [PromptBlocks(0, 64, [1, 2], 32), PromptBlocks(1, 64, [1, 3], 32), PromptBlocks(2, 50, [1, 2], 32)]
    # second: block 1 (32 tokens); third: blocks 1 and 18 of block 2 -> 50 matched, but the last
    # token is always computed: 49 -> 48 in 16-token server blocks
    assert implied_hits(ps, 16, 0) == (32 + 48, 64 + 64 + 50)
    assert implied_hits(ps, 32, 0) == (32 + 32, 178)
    # a BOS token shifts every block: 32 matched + BOS = 33 -> 32; 50 + 1 -> 48
    assert implied_hits(ps, 16, 1) == (32 + 48, 65 + 65 + 51)
    unrelated = [PromptBlocks(i, 64, [10 * i, 10 * i + 1], 32) for i in range(3)]
    assert implied_hits(unrelated, 16, 0) == (0, 192)


def test_send_lag_is_the_send_time_less_the_scheduled_one():
    t0 = 10**9
    recs = [
        RequestRecord(i, "measure", 1, 1, scheduled_ns=t0 + i, send_ns=t0 + i + d)
        for i, d in enumerate([0, 2_000_000, 500_000])
    ]
    lag = send_lag_ms(recs)
    assert lag["max"] == 2.0 and lag["p50"] == 0.5 and np.isclose(lag["p99"], 1.97)


def test_a_trace_has_no_first_wave_to_gate(tmp_path):
    p = scenario(tmp_path, GOOD)
    p.write_text(p.read_text() + "gates:\n  performance: [{metric: median_ttft_first_wave_ms, max_worse_pct: 5}]\n")
    with pytest.raises(
        ScenarioError, match="median_ttft_first_wave_ms needs a first wave, which a replayed trace has none of"
    ):
        load_scenario(p)
