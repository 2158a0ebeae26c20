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

from vse.history import store as history
from vse.report import trend
from vse.rundir.packed import unpack

EX = ROOT / "reports" / "examples"


def vse(*args, cwd=ROOT):
    return subprocess.run(
        [sys.executable, "-m", "vse.cli", *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=600
    )


def test_ingest_is_idempotent_and_skips_a_half_written_run(tmp_path):
    run = unpack(EX / "cpu-smoke", tmp_path / "r")
    db_path = tmp_path / "h.sqlite"
    r = vse("history", "--db", db_path, run, run)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "8 run-level rows added" in r.stderr and "already in the history" in r.stderr
    db = history.connect(db_path)
    with db.connect() as c:
        assert c.execute(sa.text("SELECT COUNT(*) FROM runs")).scalar() == 8
        row = c.execute(
            sa.text(
                "SELECT scenario, arm, backend, vllm, gpu, server_start, started, workload, calibration "
                "FROM runs WHERE arm = 'candidate' ORDER BY repeat DESC"
            )
        ).first()
        keys = {k for (k,) in c.execute(sa.text("SELECT DISTINCT key FROM metrics"))}
        gates = c.execute(sa.text("SELECT COUNT(*) FROM gates WHERE run = :r"), {"r": run.name}).scalar()
        tp = c.execute(
            sa.text(
                "SELECT rel_change, ci_low, ci_high, verdict FROM comparisons WHERE run = :r AND "
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
    assert r.returncode == 0 and "skipped:" in r.stderr and "status failed (not finished)" in r.stderr


def test_the_nightly_history_step_on_a_reports_folder_with_examples_failed_and_finished_runs(tmp_path):
    """`.buildkite/nightly.yml`'s exact history command on reports/ holding the committed examples, a
    failed run (flashinfer on Hopper exits 4 every night) and two finished runs: it used to exit 2."""
    import shutil

    import yaml

    reports = tmp_path / "reports"
    shutil.copytree(EX / "cpu-smoke", reports / "examples" / "cpu-smoke")
    shutil.copytree(EX / "cpu-smoke-aa", reports / "examples" / "cpu-smoke-aa")
    a, b = (
        unpack(EX / "cpu-smoke", reports, "20261201T020000Z-a"),
        unpack(EX / "cpu-smoke-aa", reports, "20261201T030000Z-b"),
    )
    failed = unpack(EX / "cpu-smoke", reports, "20261201T040000Z-failed")
    (failed / "run.json").write_text(json.dumps({**json.loads((failed / "run.json").read_text()), "status": "failed"}))
    step = next(
        s for s in yaml.safe_load((ROOT / ".buildkite" / "nightly.yml").read_text())["steps"] if s.get("key") == "trend"
    )
    line = next(ln for ln in step["command"].splitlines() if "vse history" in ln)
    cmd = line.split(";")[0].replace("$$", "$").replace("bin/vse", f"{sys.executable} -m vse.cli")
    r = subprocess.run(
        ["bash", "-c", cmd],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        env={"HISTORY": str(tmp_path / "h.sqlite"), "PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)},
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert (
        "example:cpu-smoke: 8 run-level rows added" in r.stderr and "20261201T040000Z-failed: status failed" in r.stderr
    )
    assert f"{a.name}: 8 run-level rows added" in r.stderr and f"{b.name}: 8 run-level rows added" in r.stderr
    r = subprocess.run(
        ["bash", "-c", cmd],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        env={"HISTORY": str(tmp_path / "h.sqlite"), "PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)},
    )
    assert r.returncode == 0 and r.stderr.count("already in the history") == 4


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
    rid = c.execute(history.RUNS.insert().values(run=run, started=started, **row)).inserted_primary_key[0]
    c.execute(history.METRICS.insert().values(run_id=rid, key="output_throughput", value=value))


def test_series_never_mix_workloads_or_calibration_arms_and_one_night_says_na(tmp_path):
    db = history.connect(tmp_path / "h.sqlite")
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
    db = history.connect(tmp_path / "h.sqlite")
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
    db = history.connect(tmp_path / "h.sqlite")
    with db.begin() as c:
        for i, outcome in enumerate(("pass", "fail", "fail")):
            c.execute(
                history.GATES.insert().values(
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
    db = history.connect(path)
    cols = {c["name"] for c in sa.inspect(db).get_columns("runs")}
    assert {"workload", "calibration", "gpu_count", "tp", "scenario_sha", "build_url"} <= cols
    with db.connect() as c:
        assert c.execute(sa.text("SELECT run FROM runs")).scalar() == "old"


def test_ingest_reads_results_json_while_it_matches_the_raw_data_and_analyses_again_when_not(tmp_path, monkeypatch):
    """history reads a run's results.json (no second analysis) only while its raw_files list is the
    raw data beside it; a record file changed since (here truncated mid-line) is analysed again,
    and the analysis refuses it with the file named."""
    from vse.errors import DamagedRunError
    from vse.report import build

    run = unpack(EX / "cpu-smoke", tmp_path / "r")
    build(run)  # the reports a finished run has
    expected = json.loads((run / "results.json").read_text())
    monkeypatch.setattr(history, "analyze", lambda *_a, **_k: pytest.fail("analysed again"))
    res = history.results(run)
    assert res["exit_code"] == expected["exit_code"] and len(res["arms"]["baseline"]["runs"]) == 4
    db = history.connect(tmp_path / "h.sqlite")
    assert history.ingest(db, run).added == 8
    monkeypatch.undo()
    rec = run / "candidate" / "bench-1.jsonl"
    rec.write_bytes(rec.read_bytes()[:-200])
    with pytest.raises(DamagedRunError, match="bench-1.jsonl"):
        history.results(run)
