"""Several client processes: records from each merge into one run on the shared monotonic clock.
The server here is benchmarks/reference_server.py (a scripted stream, used only to drive the
client's own machinery; vLLM measurements always use vLLM)."""

import socket
import subprocess
import sys
import time
import urllib.request

import pytest
from conftest import ROOT

from vse.loadgen.client import RequestParams
from vse.loadgen.datasets import Prompt
from vse.loadgen.runner import LoadShape, run_load


@pytest.fixture
def reference_server():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "reference_server.py"),
            "--port",
            str(port),
            "--ttft-ms",
            "20",
            "--itl-ms",
            "5",
        ]
    )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(url + "/health", timeout=1).read()
                break
            except OSError:
                time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


def test_two_client_processes_merge_their_records(reference_server):
    prompts = [Prompt(i, f"req {i}", 2, 16) for i in range(10)]
    res = run_load(RequestParams(reference_server, "reference"), prompts, LoadShape(max_concurrency=4), processes=2)
    assert res.processes == 2 and len(res.records) == 10
    assert {r.worker for r in res.records} == {0, 1}
    assert all(r.success and r.output_tokens == 16 and len(r.chunk_ns) == 16 for r in res.records)
    assert sorted(r.index for r in res.records) == list(range(10))
    # one shared clock: every request was sent after the common start instant and before the end
    for r in res.records:
        assert res.started_ns <= r.send_ns, (r.worker, r.send_ns - res.started_ns)
        assert r.send_ns < r.chunk_ns[0] <= r.end_ns <= res.ended_ns, (r.worker, r.end_ns - res.ended_ns)
    # TTFT near the scripted 20 ms, gaps near 5 ms: the merged timestamps are coherent
    assert all(0.015 < r.ttft_s < 0.5 for r in res.records)
