"""The results history: idempotent ingest of run directories and committed examples, a reports/
folder walked with unfinished runs and non-runs skipped (the nightly's exact history step), series
that never mix workloads or calibration arms, gate outcomes kept, and a regression over synthetic
nights found and shown."""

import json
import subprocess
import sys

import numpy as np
import pytest
import sqlalchemy as sa
from conftest import ROOT

from vse.errors import tail
from vse.history import schema
from vse.history import store as history
from vse.report import trend
from vse.rundir.packed import unpack

EX = ROOT / "reports" / "examples"


def vse(*args, cwd=ROOT):
    return subprocess.run(
        [sys.executable, "-m", "vse.cli", *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=600
    )


def vse_here(capsys, *args):
    """The command in this process (a subprocess costs a second or two of imports)."""
    from vse import cli

    code = cli.main([str(a) for a in args])
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(args, code, out, err)


def test_ingest_is_idempotent_and_skips_a_half_written_run(tmp_path):
    run = unpack(EX / "cpu-smoke", tmp_path / "r")
    db_path = tmp_path / "h.sqlite"
    r = vse("history", "--db", db_path, run, run)
    assert r.returncode == 0, tail(r.stderr)
    assert "8 run-level rows added" in r.stdout and "already in the history" in r.stdout
    db = schema.connect(db_path)
    with db.connect() as c:
        assert c.execute(sa.text("SELECT COUNT(*) FROM runs")).scalar() == 8
        row = c.execute(
            sa.text(
                "SELECT scenario, arm, backend, vllm, gpu, server_start, started, workload, calibration "
                "FROM runs WHERE arm = 'candidate' ORDER BY repeat DESC"
            )
        ).first()
        keys = {k for (k,) in c.execute(sa.text("SELECT DISTINCT key FROM metrics"))}
        gates = c.execute(sa.text("SELECT COUNT(*) FROM gates WHERE name = :r"), {"r": run.name}).scalar()
        tp = c.execute(
            sa.text(
                "SELECT rel_change, ci_low, ci_high, verdict FROM comparisons WHERE name = :r AND "
                "metric = 'output_throughput'"
            ),
            {"r": run.name},
        ).first()
    assert row[:5] == ("cpu-smoke", "candidate", "none", "0.32.0", "cpu") and row[5] == 1 and row[6].startswith("2026")
    assert row[7] == "isl=128 osl=64 n=32 c=8 rate=inf kind=random" and row[8] == 0
    assert {"output_throughput", "median_tpot_ms", "p99_ttft_ms", "median_ttft_first_wave_ms"} <= keys and gates > 0
    res = json.loads((EX / "cpu-smoke" / "results.json").read_text())
    want = next(m for m in res["comparison"] if m["key"] == "output_throughput")
    assert tp[0] == pytest.approx(want["rel_change"]) and tp[1] <= tp[0] <= tp[2] and tp[3] == want["verdict"]
    half = unpack(EX / "cpu-smoke-aa", tmp_path / "h")
    meta = json.loads((half / "run.json").read_text())
    (half / "run.json").write_text(json.dumps({**meta, "status": "failed"}))
    r = vse("history", "--db", db_path, half)
    assert r.returncode == 0 and "skipped:" in r.stdout and "status failed (not finished)" in r.stdout


def test_a_run_is_its_content_whatever_its_folder_is_called(tmp_path, capsys):
    """The same run copied under another name (an artifact downloaded again, an example unpacked
    elsewhere) is one run; two different runs whose folders share a base name are two (the history
    once kept 135 rows from 22 of 24 examples: h200-calibration/aa was 'already' there as 'aa')."""
    reports = tmp_path / "reports"
    one = unpack(EX / "cpu-smoke", reports / "a", "aa")
    same = unpack(EX / "cpu-smoke", reports / "b", "copy-of-aa")
    other = unpack(EX / "cpu-smoke-aa", reports / "c", "aa")
    r = vse_here(capsys, "history", "--db", tmp_path / "h.sqlite", one, same, other)
    assert r.returncode == 0, tail(r.stderr)
    assert r.stdout.count("8 run-level rows added") == 2 and "copy-of-aa: already in the history" in r.stdout
    assert history.run_key(one) == history.run_key(same) != history.run_key(other)


def test_a_walk_leaves_committed_examples_out_unless_asked(tmp_path, capsys):
    import shutil

    reports = tmp_path / "reports"
    for ex in ("cpu-smoke", "cpu-calibration-flow/aa"):
        shutil.copytree(EX / ex, reports / "examples" / ex)
    unpack(EX / "cpu-smoke-aa", reports, "20261201T020000Z-night")
    db = tmp_path / "h.sqlite"
    r = vse_here(capsys, "history", "--db", db, reports)
    assert r.returncode == 0 and "skipped: 2 committed examples under" in r.stdout, tail(r.stderr)
    assert "20261201T020000Z-night: 8 run-level rows added" in r.stdout and "example:" not in r.stdout
    r = vse_here(capsys, "history", "--db", db, reports, "--examples")
    assert r.returncode == 0, tail(r.stderr)
    assert "example:cpu-smoke: 8 run-level rows added" in r.stdout  # named by their path under examples/
    assert "example:cpu-calibration-flow/aa:" in r.stdout


def test_series_are_keyed_by_what_was_measured_not_by_the_machine():
    from vse.orchestration.scenario_check import load_scenario

    base = load_scenario(ROOT / "scenarios" / "cpu-smoke.yaml")
    elsewhere = load_scenario(ROOT / "scenarios" / "cpu-smoke.yaml", overrides=["server.vllm.python=/other/python"])
    longer = load_scenario(ROOT / "scenarios" / "cpu-smoke.yaml", overrides=["workload.dataset.output_len=128"])
    eager = load_scenario(ROOT / "scenarios" / "cpu-smoke.yaml", overrides=["server.extra_args=[]"])
    assert history.settings_digest(base, "baseline") == history.settings_digest(elsewhere, "baseline")
    assert len({history.settings_digest(x, "baseline") for x in (base, longer, eager)}) == 3
    # an arm's series is its own: the baseline's digest does not see what it was compared with
    other = load_scenario(
        ROOT / "scenarios" / "cpu-smoke.yaml", overrides=["arms.candidate.extra_args=[--dtype,float16]"]
    )
    assert history.settings_digest(other, "baseline") == history.settings_digest(base, "baseline")
    assert history.settings_digest(other, "candidate") != history.settings_digest(base, "candidate")


def night(c, run, started, value, **key):
    row = (
        dict(
            arm="candidate",
            repeat=0,
            server_start=0,
            scenario="nightly",
            backend="torch",
            label="torch",
            workload="isl=1024 osl=1024 n=384 c=128 rate=inf kind=random",
            gpu="NVIDIA H200",
            gpu_count=1,
            tp=1,
            calibration=0,
        )
        | key
    )
    rid = c.execute(schema.RUNS.insert().values(run=run, started=started, **row)).inserted_primary_key[0]
    c.execute(schema.METRICS.insert().values(run_id=rid, key="output_throughput", value=value))


def test_series_never_mix_workloads_or_calibration_arms_and_one_night_says_na(tmp_path):
    db = schema.connect(tmp_path / "h.sqlite")
    with db.begin() as c:
        for i in range(3):
            night(c, f"n{i}", f"2026-11-0{i + 1}T02:00:00+00:00", 10_800.0)
        night(
            c,
            "quick",
            "2026-11-04T02:00:00+00:00",
            1_185.0,
            workload="isl=1024 osl=1024 n=32 c=128 rate=inf kind=random",
        )
        night(c, "planted", "2026-11-05T02:00:00+00:00", 10_000.0, calibration=1)
    series = trend.build(db, None)
    assert sorted(len(s.points) for s in series) == [1, 1, 3]  # three series, not one "116.92%"-noise series
    md = trend.markdown(series)
    assert "nan%" not in md and "| n/a |" in md and "calibration arm" in md


def test_trend_finds_a_regression_over_nights(tmp_path):
    db = schema.connect(tmp_path / "h.sqlite")
    rng = np.random.default_rng(3)
    with db.begin() as c:
        for n in range(30):
            level = 10_000 * (0.97 if n >= 20 else 1.0)
            for rep in range(2):
                night(
                    c,
                    f"night-{n:02d}",
                    f"2026-11-{n + 1:02d}T02:00:00+00:00",
                    level * float(np.exp(rng.normal(0, 0.004))),
                    repeat=rep,
                )
    (s,) = trend.build(db, None)
    assert [c.index for c in s.regressions()] == [20] and s.points[20].run == "night-20"
    md = trend.markdown([s])
    assert "**regression** -" in md and "% from night-20" in md and "window median" in md
    assert trend.html([s]).count("<svg") == 1


def test_when_a_gate_first_failed_is_one_query(tmp_path):
    db = schema.connect(tmp_path / "h.sqlite")
    with db.begin() as c:
        for i, outcome in enumerate(("pass", "fail", "fail")):
            c.execute(
                schema.GATES.insert().values(
                    run=f"r{i}",
                    gate="output_throughput not worse by > 5%",
                    outcome=outcome,
                    started=f"2026-11-0{i + 1}",
                    scenario="s",
                )
            )
    assert history.first_failure(db, "output_throughput not worse by > 5%") == ("r1", "2026-11-02")


def test_an_older_sqlite_history_is_migrated(tmp_path):
    import sqlite3

    path = tmp_path / "old.sqlite"
    old = sqlite3.connect(path)
    old.executescript(
        "CREATE TABLE runs (id INTEGER PRIMARY KEY, run TEXT NOT NULL, arm TEXT NOT NULL, repeat INTEGER "
        "NOT NULL, server_start INTEGER NOT NULL, scenario TEXT NOT NULL, started TEXT NOT NULL);"
        "INSERT INTO runs VALUES (1, 'old', 'baseline', 0, 0, 's', '2026-10-01');"
    )
    old.commit()
    old.close()
    db = schema.connect(path)
    cols = {c["name"] for c in sa.inspect(db).get_columns("runs")}
    assert {"workload", "calibration", "gpu_count", "tp", "scenario_sha", "build_url", "name", "settings"} <= cols
    assert {"metrics", "gates", "comparisons", "acks", "alembic_version"} <= set(sa.inspect(db).get_table_names())
    with db.connect() as c:
        assert c.execute(sa.text("SELECT run, name FROM runs")).first() == ("old", "old")  # its name, its identity
        assert c.execute(sa.text("SELECT version_num FROM alembic_version")).scalar() == "0003"
    schema.connect(path)  # opening it again changes nothing


def test_an_accepted_regression_stops_failing_the_trend(tmp_path, capsys, monkeypatch):
    """A real change is seen, understood and accepted once: vse trend --ack records who and why, and
    the nightly goes green; a later regression fails it again. (In-process, the window-median
    detector: the flow is under test here, Otava in tests/integration/test_changepoint.py.)"""
    from vse import cli
    from vse.models import provision

    monkeypatch.setattr(provision, "changepoint_python", lambda cache: None)

    def trend_cmd(*args):
        code = cli.main(["trend", "--db", str(db_path), "--out", str(tmp_path / "t"), *map(str, args)])
        out, err = capsys.readouterr()
        return code, out, err

    db_path = tmp_path / "h.sqlite"
    db = schema.connect(db_path)
    with db.begin() as c:
        for n in range(30):
            level = 10_000 * (0.97 if n >= 20 else 1.0)
            vllm = f"0.26.1.dev{n}+g{n:07x}"  # a nightly wheel's version names its commit
            night(c, f"night-{n:02d}", f"2026-11-{n + 1:02d}T02:00:00+00:00", level * (1 + 0.001 * (n % 3)), vllm=vllm)
    code, out, _ = trend_cmd()
    assert code == 1 and "**regression** -" in out and "--ack " in out, tail(out)
    # the two nights around the change, with the vLLM each ran: the ends of a bisection
    assert (
        "last good night night-19 (vLLM 0.26.1.dev19+g0000013), first bad night-20 (vLLM 0.26.1.dev20+g0000014)" in out
    )
    # the same, for a machine: what `vse bisect --from-trend` reads
    (reg,) = json.loads((tmp_path / "t" / "trend.json").read_text())["open_regressions"]
    assert (reg["metric"], reg["last_good"]["vllm"], reg["first_bad"]["run"]) == (
        "output_throughput",
        "0.26.1.dev19+g0000013",
        "night-20",
    )
    code, _, err = trend_cmd("--ack", "night-20", "--metric", "output_throughput")
    assert code == 2 and "needs a reason" in err
    code, _, err = trend_cmd("--ack", "night-2", "--metric", "output_throughput", "--why", "x")
    assert code == 2 and "match" in err  # a prefix that names several runs is refused
    why = "the new scheduler trades 3% throughput for TTFT"
    code, _, err = trend_cmd("--ack", "night-20", "--metric", "output_throughput", "--why", why, "--by", "release-eng")
    assert code == 0 and "accepted: output_throughput from run night-20, by release-eng" in err
    code, out, _ = trend_cmd()
    assert code == 0, tail(out)
    assert f"regression, accepted by release-eng ({why})" in out
    with db.begin() as c:  # ten more nights, 3% lower again: a new regression nobody accepted
        for n in range(30, 40):
            night(c, f"night-{n:02d}", f"2026-12-{n - 29:02d}T02:00:00+00:00", 9_409 * (1 + 0.001 * (n % 3)))
    code, out, _ = trend_cmd()
    assert code == 1 and "% from night-30" in out and "**regression**" in out, tail(out)
    # accepted by what a bisection of those nights found: its answer is the recorded reason
    bis = tmp_path / "20261210T080000Z-bisect-nightly"
    bis.mkdir()
    step = {
        "build": "g000001e",
        "changes": {"output_throughput": {"rel_change": -0.03, "ci_low": -0.035, "ci_high": -0.025}},
    }
    answer = {"culprit": "g000001e", "last_good": "g000001d", "first_bad": "g000001e", "skipped": []}
    answer |= {"decided_steps": 4, "p_wrong_at_most": 0.05, "more_than_one_change": []}
    (bis / "bisect.json").write_text(json.dumps({"status": "running", "answer": None, "steps": [step]}))
    code, _, err = trend_cmd("--ack", "night-30", "--metric", "output_throughput", "--bisect", bis)
    assert code == 2 and "is not finished: it explains no change" in err
    (bis / "bisect.json").write_text(json.dumps({"status": "done", "answer": {"culprit": None, "ends": "good"}}))
    code, _, err = trend_cmd("--ack", "night-30", "--metric", "output_throughput", "--bisect", bis)
    assert code == 2 and "found no regression (its bad end did not FAIL)" in err
    (bis / "bisect.json").write_text(json.dumps({"status": "done", "answer": answer, "steps": [step]}))
    code, _, err = trend_cmd("--ack", "night-30", "--metric", "output_throughput", "--bisect", bis, "--by", "oncall")
    assert code == 0, err
    code, out, _ = trend_cmd()
    assert code == 0, tail(out)
    assert (
        f"accepted by oncall (vse bisect ({bis}): culprit g000001e, after g000001d; "
        "output_throughput -3.00% [-3.50%, -2.50%]; chance wrong at most 5%)" in out
    )


def test_ingest_reads_results_json_while_it_matches_the_raw_data_and_analyses_again_when_not(tmp_path, monkeypatch):
    """history reads a run's results.json (no second analysis) only while its raw_files list is the
    raw data beside it; a record file changed since (here truncated mid-line) is analysed again,
    and the analysis refuses it with the file named."""
    from vse.errors import DamagedRunError
    from vse.report import build, results_json

    run = unpack(EX / "cpu-smoke", tmp_path / "r")
    build(run)  # the reports a finished run has
    expected = json.loads((run / "results.json").read_text())
    monkeypatch.setattr(results_json, "analyze", lambda *_a, **_k: pytest.fail("analysed again"))
    res = results_json.current(run)
    assert res["exit_code"] == expected["exit_code"] and len(res["arms"]["baseline"]["runs"]) == 4
    db = schema.connect(tmp_path / "h.sqlite")
    assert history.ingest(db, run, results_json.current).added == 8
    monkeypatch.undo()
    rec = run / "candidate" / "bench-1.jsonl"
    rec.write_bytes(rec.read_bytes()[:-200])
    with pytest.raises(DamagedRunError, match="bench-1.jsonl"):
        results_json.current(run)


def test_a_path_that_does_not_exist_is_refused_and_no_folder_is_made(tmp_path, capsys):
    r = vse_here(capsys, "history", "--db", tmp_path / "h.sqlite", tmp_path / "no-such-run")
    assert r.returncode == 2 and "no-such-run: no such file or directory" in r.stdout
    assert not (tmp_path / "h.sqlite").exists()  # a refused ingest creates no database
    r = vse_here(capsys, "history", "--db", tmp_path / "missing" / "h.sqlite", tmp_path)
    assert r.returncode == 2 and "the folder" in r.stderr and "does not exist" in r.stderr
    assert not (tmp_path / "missing").exists()


def test_postgres_urls_in_both_spellings_and_an_unreachable_database_in_one_line():
    """VSE_HISTORY_URL may say postgres:// (libpq's short form: it failed with NoSuchModuleError);
    a database that cannot be reached is named by host and port, never with its password."""
    import pytest

    from vse.history import schema
    from vse.history.schema import HistoryError

    assert schema.url_of("postgres://u:p@db:5433/h") == schema.url_of("postgresql://u:p@db:5433/h")
    assert schema.url_of("postgres://u:p@db:5433/h").startswith("postgresql+psycopg://")
    with pytest.raises(HistoryError) as e:
        schema.connect("postgres://vse:hunter2@127.0.0.1:1/history")
    said = str(e.value)
    assert "postgresql 127.0.0.1:1/history cannot be reached" in said and "hunter2" not in said
    assert "\n" not in said


def test_the_trends_hint_offers_an_ack_for_every_regressed_series(tmp_path, capsys, monkeypatch):
    """Two series regressed the same night (two scenarios): the hint gave one --ack line, so the
    second regression stayed red with no command offered for it."""
    from vse import cli
    from vse.models import provision

    monkeypatch.setattr(provision, "changepoint_python", lambda cache: None)
    db_path = tmp_path / "h.sqlite"
    with schema.connect(db_path).begin() as c:
        for scenario in ("nightly", "other"):
            for n in range(30):
                level = 10_000 * (0.97 if n >= 20 else 1.0)
                started = f"2026-11-{n + 1:02d}T02:00:00+00:00"
                night(c, f"{scenario}-{n:02d}", started, level * (1 + 0.001 * (n % 3)), scenario=scenario)
    code = cli.main(["trend", "--db", str(db_path), "--out", str(tmp_path / "t")])
    out = capsys.readouterr().out
    assert code == 1 and "2 series end in a regression nobody accepted" in out
    acks = [ln for ln in out.splitlines() if "bin/vse trend --db ... --ack" in ln]
    assert len(acks) == 2 and any("--ack nightly-20" in a for a in acks) and any("--ack other-20" in a for a in acks)
