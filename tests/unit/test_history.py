"""The results history (SQLite) and the trend report: idempotent ingest of committed example runs,
a half-written run refused in one line, and a regression over synthetic nights found and shown."""

import json
import subprocess
import sys

import numpy as np
from conftest import ROOT

from vse.history import store as history
from vse.report import trend

sys.path.insert(0, str(ROOT / "benchmarks"))
from pack_example import unpack


def test_ingest_is_idempotent_and_refuses_a_half_written_run(tmp_path):
    run = unpack(ROOT / "reports" / "examples" / "cpu-smoke", tmp_path / "r")
    db_path = tmp_path / "h.sqlite"
    r = subprocess.run([sys.executable, "-m", "vse.cli", "history", "--db", str(db_path), str(run), str(run)],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "8 run-level rows added" in r.stderr and "already in the history" in r.stderr
    db = history.connect(db_path)
    assert db.execute("SELECT COUNT(*) FROM runs").fetchone()[0] == 8
    row = db.execute("SELECT scenario, arm, backend, vllm, gpu, server_start, started FROM runs WHERE arm = 'candidate' "
                     "ORDER BY repeat DESC").fetchone()
    assert row[:5] == ("cpu-smoke", "candidate", "none", "0.32.0", "cpu") and row[5] == 1 and row[6].startswith("2026")
    keys = {k for (k,) in db.execute("SELECT DISTINCT key FROM metrics")}
    assert {"output_throughput", "median_tpot_ms", "p99_ttft_ms", "median_ttft_first_wave_ms"} <= keys
    half = unpack(ROOT / "reports" / "examples" / "cpu-smoke-aa", tmp_path / "h")
    meta = json.loads((half / "run.json").read_text())
    (half / "run.json").write_text(json.dumps({**meta, "status": "running"}))
    r = subprocess.run([sys.executable, "-m", "vse.cli", "history", "--db", str(db_path), str(half)],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "did not finish (status running); not ingested" in r.stderr
    assert db.execute("SELECT COUNT(*) FROM runs").fetchone()[0] == 8  # nothing of it went in


def test_trend_finds_a_regression_over_nights(tmp_path):
    db = history.connect(tmp_path / "h.sqlite")
    rng = np.random.default_rng(3)
    for night in range(30):
        level = 10_000 * (0.97 if night >= 20 else 1.0)
        for rep in range(2):
            cur = db.execute("INSERT INTO runs (run, arm, repeat, server_start, scenario, backend, started) "
                             "VALUES (?, 'candidate', ?, 0, 'nightly', 'torch', ?)",
                             (f"night-{night:02d}", rep, f"2026-11-{night + 1:02d}T02:00:00+00:00"))
            db.execute("INSERT INTO metrics VALUES (?, 'output_throughput', ?)",
                       (cur.lastrowid, level * float(np.exp(rng.normal(0, 0.004)))))
    db.commit()
    (s,) = trend.build(db, None)
    assert [c.index for c in s.regressions()] == [20] and s.points[20].run == "night-20"
    md = trend.markdown([s])
    assert "**regression** -" in md and "% from night-20" in md
    assert trend.html([s]).count("<svg") == 1
