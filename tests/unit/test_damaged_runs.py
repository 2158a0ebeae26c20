"""Raw data that cannot be changed without the verdict noticing. Each kind of damage a person found
reading as a result (a PASS with moved numbers, a FAIL turned PASS) is refused here, exit 2 with the
file named: by the design checks on any run (the records a run holds against the requests its
settings say it sent, no two runs alike) and, on a run with a seal, by the seal (every raw file's
sha256 as the run wrote it). The run is the committed CPU smoke example's real raw data."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
from conftest import ROOT

from vse.analysis import analyze
from vse.errors import DamagedRunError, tail
from vse.rundir import seal
from vse.rundir.layout import RunDir
from vse.rundir.packed import unpack
from vse.rundir.records import read_jsonl

EX = ROOT / "reports" / "examples"


def vse(capsys, *args):
    """The command in this process, as its user would call it: exit code, stdout, stderr."""
    from vse import cli

    code = cli.main([str(a) for a in args])
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(args, code, out, err)


@pytest.fixture
def run(tmp_path):
    return unpack(EX / "cpu-smoke", tmp_path, "r")


def sealed(run):
    """The run as a current suite leaves it: every raw file it wrote, sealed."""
    layout = RunDir(run)
    files = [p for a in layout.arm_dirs() for k in a.metas() for p in (a.records(k), a.meta(k))]
    files += [layout.environment, *sorted((layout.path / "prompts").glob("*"))]  # sealed at capture
    seal.add(run, files + [a.servers for a in layout.arm_dirs() if a.servers.is_file()])
    return run


def lines(path):
    return path.read_text().splitlines(keepends=True)


def refused(run, match):
    with pytest.raises(DamagedRunError, match=match):
        analyze(run)


def test_the_intact_run_reads_and_is_sealed_as_written(run):
    assert analyze(run).exit_code == 0
    assert seal.verify(sealed(run)) and analyze(run).exit_code == 0


@pytest.mark.parametrize("with_seal", [False, True])
def test_a_run_copied_over_another_is_refused(run, with_seal):
    """bench-3.jsonl replaced by a copy of bench-0.jsonl read PASS, median TPOT -23.59% (intact -26.52%)."""
    if with_seal:
        sealed(run)
    shutil.copy(run / "baseline" / "bench-0.jsonl", run / "baseline" / "bench-3.jsonl")
    refused(run, "bench-3.jsonl: (changed since the run sealed it|the same requests as bench-0.jsonl)")


@pytest.mark.parametrize("with_seal", [False, True])
def test_a_duplicate_run_added_is_refused(run, with_seal):
    """A copy added as bench-4 read PASS -27.34% and 9 history rows."""
    if with_seal:
        sealed(run)
    for suffix in (".jsonl", ".meta.json"):
        shutil.copy(run / "candidate" / f"bench-0{suffix}", run / "candidate" / f"bench-4{suffix}")
    refused(run, r"bench-4\.(jsonl|meta\.json): (not in the run's seal|the same requests as bench-0.jsonl)")


@pytest.mark.parametrize(
    "cut, said",
    [
        (lambda ls: ls[: len(ls) - 16], "16 measured requests, its settings say 32"),  # cut at a line boundary
        (lambda ls: [], "0 measured requests, its settings say 32"),  # emptied
        (lambda ls: ls[:-1], "31 measured requests, its settings say 32"),  # one line deleted
    ],
)
def test_records_missing_from_a_run_are_refused_without_a_seal(run, cut, said):
    path = run / "baseline" / "bench-2.jsonl"
    path.write_text("".join(cut(lines(path))))
    refused(run, f"bench-2.jsonl: {said}")


def test_a_fail_cannot_become_a_pass_by_deleting_the_failed_request(run, capsys):
    """The run as written had one failed candidate request: FAIL. Deleting that line read PASS."""
    path = run / "candidate" / "bench-1.jsonl"
    recs = [json.loads(x) for x in lines(path)]
    i = next(j for j, r in enumerate(recs) if r["phase"] == "measure")
    recs[i].update(success=False, error="HTTP 500")
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    sealed(run)  # what the run wrote, failed request included
    a = analyze(run)
    assert a.exit_code == 1 and any(
        g.name == "candidate failed requests" and g.outcome.value == "fail" for g in a.gates
    )
    path.write_text("".join(json.dumps(r) + "\n" for j, r in enumerate(recs) if j != i))
    refused(run, "bench-1.jsonl: changed since the run sealed it")
    r = vse(capsys, "report", run)
    assert r.returncode == 2 and "bench-1.jsonl: changed since the run sealed it" in r.stderr.strip().splitlines()[-1]


def test_an_edited_number_is_refused_by_the_seal(run):
    """Same line count, same requests, one latency moved: only the seal can tell."""
    sealed(run)
    path = run / "candidate" / "bench-2.jsonl"
    text = path.read_text()
    recs = [json.loads(x) for x in text.splitlines()]
    recs[-1]["end_ns"] += 1_000_000
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    refused(run, "candidate/bench-2.jsonl: changed since the run sealed it")


@pytest.mark.parametrize("with_seal", [False, True])
def test_a_missing_servers_json_or_arm_is_a_damaged_run(run, with_seal, capsys):
    if with_seal:
        sealed(run)
    (run / "candidate" / "servers.json").unlink()
    refused(run, "candidate/servers.json: (missing|sealed by the run but missing)")
    shutil.rmtree(run / "candidate")
    r = vse(capsys, "report", run)
    assert r.returncode == 2, tail(r.stderr)  # was FAIL, exit 1, and 4 history rows
    assert "candidate" in r.stderr and "damaged" in r.stderr.strip().splitlines()[-1]


def test_history_refuses_a_run_changed_after_its_report(run, tmp_path, capsys):
    """results.json matched by size alone let an edited run into the history; the seal is checked first."""
    sealed(run)
    assert vse(capsys, "report", run).returncode == 0
    path = run / "baseline" / "bench-0.jsonl"
    size = path.stat().st_size
    recs = [json.loads(x) for x in lines(path)]
    recs[-1]["end_ns"] += 1 if recs[-1]["end_ns"] % 10 != 9 else -1  # as many digits: the same size
    path.write_text("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in recs))
    assert path.stat().st_size == size
    r = vse(capsys, "history", "--db", tmp_path / "h.sqlite", run)
    assert r.returncode == 2 and "bench-0.jsonl: changed since the run sealed it" in r.stdout


def test_report_on_a_packed_example_writes_nothing(tmp_path, capsys):
    """It used to analyse an example with no raw data beside it and write FAIL over its results."""
    ex = tmp_path / "cpu-smoke"
    shutil.copytree(EX / "cpu-smoke", ex)
    before = {p.name: p.read_bytes() for p in ex.iterdir() if p.is_file()}
    r = vse(capsys, "report", ex)
    assert r.returncode == 2 and "a committed example whose raw data is packed" in r.stderr
    assert {p.name: p.read_bytes() for p in ex.iterdir() if p.is_file()} == before


@pytest.mark.parametrize(
    "edit, said",
    [
        (lambda r: r.update(send_ns=float("nan")), "line 1 is not a request record .send_ns is nan"),
        (
            lambda r: r.update(chunk_ns=[r["send_ns"] - 5, *r["chunk_ns"][1:]]),
            "line 1 is not a request record .chunk_ns",
        ),
    ],
    ids=["nan", "negative-latency"],
)
def test_impossible_values_are_named_with_file_and_line(run, edit, said):
    """NaN timestamps ended in 'internal error ValueError', negative latencies in 'IndexError'."""
    path = run / "baseline" / "bench-1.jsonl"
    recs = [json.loads(x) for x in lines(path)]
    edit(recs[0])
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    refused(run, f"bench-1.jsonl: {said}")


GOOD = {
    "index": 0,
    "phase": "measure",
    "prompt_len": 1,
    "expected_output_len": 3,
    "scheduled_ns": 0,
    "send_ns": 10,
    "headers_ns": 11,
    "chunk_ns": [20, 30, 30],
    "chunk_tokens": [1, 0, 2],
    "end_ns": 40,
}


@pytest.mark.parametrize(
    "field, value, said",
    [
        ("chunk_ns", [20, 30.0, 40], "chunk_ns holds a value that is not a clock reading"),
        ("chunk_ns", [20, True, 40], "chunk_ns holds a value that is not a clock reading"),
        ("chunk_ns", [20, 40, 30], "chunk_ns is not in arrival order"),
        ("chunk_ns", [5, 30, 40], "chunk_ns is not in arrival order"),  # a chunk before the send
        ("chunk_tokens", [1, -1, 2], "chunk_tokens does not match chunk_ns"),
        ("chunk_tokens", [1, 2], "chunk_tokens does not match chunk_ns"),
        ("chunk_tokens", [1, "2", 2], "chunk_tokens does not match chunk_ns"),
    ],
)
def test_each_impossible_chunk_list_is_refused_and_a_measured_one_is_read(tmp_path, field, value, said):
    path = tmp_path / "bench-0.jsonl"
    path.write_text(json.dumps(GOOD) + "\n")
    assert read_jsonl(path)[0].deliveries == [(20, 1), (30, 2)]  # chunks of one instant are one delivery
    path.write_text(json.dumps({**GOOD, field: value}) + "\n")
    with pytest.raises(DamagedRunError, match=said):
        read_jsonl(path)


def test_an_unreadable_records_file_is_named(run, monkeypatch):
    """A permission error ended in 'internal error PermissionError' (root reads every file here,
    so the denial is made where the file is opened)."""
    import builtins

    path = run / "candidate" / "bench-0.jsonl"
    real_open = builtins.open

    def denying_open(file, *a, **k):
        if str(file) == str(path):
            raise PermissionError(13, "Permission denied", str(file))
        return real_open(file, *a, **k)

    monkeypatch.setattr(builtins, "open", denying_open)
    refused(run, "candidate/bench-0.jsonl: cannot be read .Permission denied.")


def test_an_edited_accuracy_result_is_refused_by_the_seal(run):
    """The checks' outputs are sealed when they end (compare_checks): a score moved by hand is seen."""
    cand = RunDir(run).arm("candidate")
    seal.add(run, [cand.accuracy / "accuracy.json", cand.agreement])
    data = json.loads((cand.accuracy / "accuracy.json").read_text())
    key = next(iter(data["scores"]))
    data["scores"][key] = 1.0
    (cand.accuracy / "accuracy.json").write_text(json.dumps(data))
    refused(run, "candidate/accuracy/accuracy.json: changed since the run sealed it")


def test_a_run_from_before_seals_is_sealed_as_found_when_it_grows(run):
    """A resumed run made by an older suite: its first new seal covers what it already held, so its
    own earlier runs are not taken for runs added afterwards."""
    assert not seal.verify(run)  # no seal: the design checks alone
    arm = RunDir(run).arm("candidate")
    seal.add(run, [arm.servers])  # what a resumed run's next server start writes first
    assert seal.verify(run) and "candidate/bench-3.jsonl" in seal.sealed(run)
    assert analyze(run).exit_code == 0


@pytest.mark.parametrize(
    "override, said",
    [
        ("workload.usage_per_chunk=true", "usage_per_chunk False there, True here"),
        ("workload.max_concurrency=8", "max_concurrency 4 there, 8 here"),
    ],
)
def test_a_reused_arm_measured_under_another_workload_is_refused(tmp_path, override, said):
    """BASE_RUN copies an arm whatever its workload: a baseline recorded without usage per chunk
    against a candidate measured per token, or at another concurrency, is refused naming the key."""
    from rundirs import write_run

    from vse.errors import SuiteError
    from vse.orchestration.reuse import check_same_workload
    from vse.orchestration.scenario_check import load_scenario

    src = write_run(tmp_path / "src", {"baseline": [(0, 10.0)]})
    base = [
        "accuracy.enabled=false",
        "agreement.enabled=false",
        "workload.num_prompts=16",
        "workload.max_concurrency=4",
    ]
    same = load_scenario("scenarios/cpu-smoke.yaml", overrides=base)
    check_same_workload(same, "BASE_RUN", src)  # the same workload: reusable
    other = load_scenario("scenarios/cpu-smoke.yaml", overrides=[*base, override])
    with pytest.raises(SuiteError, match=f"BASE_RUN=.*its workload differs \\({said}\\)"):
        check_same_workload(other, "BASE_RUN", src)


def sealing(run):
    """The run as the current suite starts it: run.json says it seals, its scenario.yaml is sealed."""
    status = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps({**status, "seal": seal.VERSION}))
    seal.add(run, [RunDir(run).scenario])
    return sealed(run)


def test_a_deleted_seal_is_refused_not_read_as_a_run_from_before_seals(run, capsys):
    (sealing(run) / "seal.json").unlink()
    refused(run, r"seal.json: missing, though run.json says the run sealed its raw data")
    r = vse(capsys, "report", run)
    assert r.returncode == 2 and "seal.json: missing" in r.stderr.strip().splitlines()[-1]


def test_loosened_margins_in_the_runs_scenario_are_refused(run):
    sc = RunDir(sealing(run)).scenario
    sc.write_text(sc.read_text().replace("max_worse_pct: 100.0", "max_worse_pct: 999.0"))
    refused(run, "scenario.yaml: changed since the run sealed it")


def test_other_gates_are_an_explicit_option_the_report_names(run, capsys):
    """Deciding a run with other gate settings is a report option (--regate), named first in every
    report; only gates.* can differ, and the sealed scenario.yaml is untouched."""
    sealing(run)
    before = RunDir(run).scenario.read_bytes()
    r = vse(capsys, "report", run, "--regate", "gates.agreement_mode=gate")
    assert r.returncode == 1  # the smoke run's fp32 arm fails output agreement once it is gated
    summary = (run / "summary.md").read_text()
    assert "gated with settings other than those the run was made with" in summary
    assert "--regate gates.agreement_mode=gate" in summary
    assert "gated with settings other" in json.dumps(json.loads((run / "results.json").read_text())["notes"])
    assert RunDir(run).scenario.read_bytes() == before and seal.verify(run)
    r = vse(capsys, "report", run, "--regate", "workload.num_prompts=2")
    assert r.returncode == 2 and "only gates.* settings can differ" in r.stderr
    assert vse(capsys, "report", run).returncode == 0  # as it was made: its own gates, no such note
    assert "gated with settings other" not in (run / "summary.md").read_text()


def test_a_new_run_says_it_seals_and_seals_its_scenario(tmp_path):
    from vse.orchestration import compare
    from vse.orchestration.scenario_check import load_scenario

    s = load_scenario("scenarios/cpu-smoke.yaml")
    s, run_dir = compare.start_run(s, compare.CompareOptions(reports_root=tmp_path))
    assert "scenario.yaml" in seal.sealed(run_dir)
    compare.Orchestrator(s, run_dir, compare.CompareOptions(reports_root=tmp_path))  # writes run.json
    assert json.loads(RunDir(run_dir).run_json.read_text())["seal"] == seal.VERSION


def test_a_disk_that_fills_mid_run_still_leaves_run_json_saying_how_it_ended(tmp_path, monkeypatch):
    """run.json stayed at "running" with no cause when the disk filled: its last write had no room.
    Room is kept from the start (a reserve file) and given up for that write. Here the disk is full
    for every write while the reserve exists."""
    import errno

    from vse.rundir import files
    from vse.rundir.files import RunStatus

    status = RunStatus(tmp_path, scenario="x")
    reserve = RunDir(tmp_path).run_json_reserve
    assert reserve.stat().st_size == files.RESERVE_BYTES
    real = files.write_json

    def full(path, data):
        if reserve.exists():
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        real(path, data)

    monkeypatch.setattr(files, "write_json", full)
    status.finish("failed", "the disk is full, writing bench-3.jsonl")
    run = json.loads(RunDir(tmp_path).run_json.read_text())
    assert run["status"] == "failed" and "disk is full" in run["reason"] and not reserve.exists()


def test_a_run_left_at_running_says_so_instead_of_an_empty_cause():
    from vse.report.markdown import incomplete_reason

    run = {"status": "running", "phases": [{"phase": "benchmark", "at": "2026-12-06T02:36:18+00:00"}]}
    said = incomplete_reason(run)
    assert "ended without recording why" in said and "benchmark at 2026-12-06T02:36:18" in said


def test_a_run_folder_without_its_scenario_is_named_in_one_line(run, capsys):
    (run / "scenario.yaml").unlink()
    r = vse(capsys, "report", run)
    assert r.returncode == 2 and "scenario.yaml: missing; the run directory is damaged" in r.stderr
    assert "internal error" not in r.stderr


def test_the_environment_and_the_prompts_a_report_states_are_sealed(run):
    """Editing environment.json (vLLM 0.32.0 -> 0.31.0) rebuilt as PASS with the summary saying
    "vLLM 0.31.0", and so did an edited prompt file: both are sealed at capture now."""
    sealed(run)
    env = RunDir(run).environment
    env.write_text(env.read_text().replace('"0.32.0"', '"0.31.0"'))
    refused(run, "environment.json: changed since the run sealed it")
