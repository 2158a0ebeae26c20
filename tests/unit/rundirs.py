"""Synthetic run directories for tests of the analysis: the files a real run writes (scenario,
run.json, per-arm bench-K.jsonl + meta), with decode speeds chosen per run."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from vse.orchestration.scenario_check import load_scenario
from vse.rundir.records import RequestRecord, write_jsonl
from vse.scenario import dump

MS = 1_000_000


def stream(i: int, step_ms: float, tokens: int = 32) -> RequestRecord:
    t0 = 50 * MS
    chunk_ns = [t0 + int(k * step_ms * MS) for k in range(tokens)]
    r = RequestRecord(
        index=i,
        phase="measure",
        prompt_len=64,
        expected_output_len=tokens,
        scheduled_ns=0,
        send_ns=0,
        chunk_ns=chunk_ns,
        chunk_tokens=[1] * tokens,
        end_ns=chunk_ns[-1] + MS,
        success=True,
    )
    r.output_tokens, r.token_source, r.usage_completion_tokens, r.chunk_usage = tokens, "usage", tokens, True
    return r


def write_run(
    root: Path,
    runs: dict[str, list[tuple[int, float]]],
    overrides: list[str] = (),
    lag_ms: dict[tuple[str, int], float] | None = None,
    status: str = "complete",
    stopped: str | None = None,
    tokens: int = 32,
) -> Path:
    """runs: arm -> [(server start, decode step ms)] per run, in order."""
    s = load_scenario(
        "scenarios/cpu-smoke.yaml",
        overrides=[
            "accuracy.enabled=false",
            "agreement.enabled=false",
            "workload.num_prompts=16",
            "workload.max_concurrency=4",
            *overrides,
        ],
    )
    root.mkdir(parents=True, exist_ok=True)
    (root / "scenario.yaml").write_text(yaml.safe_dump(dump(s)))
    (root / "run.json").write_text(json.dumps({"status": status} | ({"stopped": stopped} if stopped else {})))
    for arm, plan in runs.items():
        d = root / arm
        d.mkdir(exist_ok=True)
        starts = sorted({start for start, _ in plan})
        servers = [{"server": n, "argv": [], "requested_backend": "none", "selected_kernel": None} for n in starts]
        (d / "servers.json").write_text(json.dumps(servers))
        for k, (start, step) in enumerate(plan):
            write_jsonl(d / f"bench-{k}.jsonl", [stream(i, step, tokens) for i in range(16)])
            meta = {
                "repeat": k,
                "server_start": start,
                "max_concurrency": 4,
                "request_rate": None,
                "loop_lag_ms": {"p50": 0.1, "p99": 1.0, "max": (lag_ms or {}).get((arm, k), 5.0)},
            }
            (d / f"bench-{k}.meta.json").write_text(json.dumps(meta))
    return root
