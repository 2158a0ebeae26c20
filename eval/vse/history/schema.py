"""The results history's tables, as the suite reads and writes them, and opening a history:
SQLite for one machine (a path), PostgreSQL for a central one every CI agent writes to
(postgresql://...). The schema is versioned with Alembic (migrations/versions): opening a history
brings it to the newest revision, whoever opens it first."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa

from vse.errors import SuiteError

MIGRATIONS = Path(__file__).with_name("migrations")


class HistoryError(SuiteError):
    pass


META = sa.MetaData()
RUNS = sa.Table(
    "runs",
    META,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("run", sa.Text, nullable=False),  # the run's identity: run_key (older rows: their folder's name)
    sa.Column("name", sa.Text),  # the run directory's name, to show
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
    sa.Column("settings", sa.Text),  # settings_digest: what was measured, in the series key
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
    sa.Column("name", sa.Text),
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
    sa.Column("name", sa.Text),
    sa.Column("baseline", sa.Float),
    sa.Column("candidate", sa.Float),
    sa.Column("rel_change", sa.Float),
    sa.Column("ci_low", sa.Float),
    sa.Column("ci_high", sa.Float),
    sa.Column("verdict", sa.Text),
    sa.Column("started", sa.Text),
    sa.Column("scenario", sa.Text),
)
ACKS = sa.Table(  # regressions someone accepted: the trend no longer fails on them
    "acks",
    META,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("run", sa.Text, nullable=False),  # the identity of the first run after the change
    sa.Column("metric", sa.Text, nullable=False),
    sa.Column("by", sa.Text, nullable=False),
    sa.Column("why", sa.Text, nullable=False),
    sa.Column("at", sa.Text, nullable=False),
    sa.UniqueConstraint("run", "metric"),
)
sa.Index("runs_by_series", RUNS.c.scenario, RUNS.c.arm, RUNS.c.backend, RUNS.c.started)


def url_of(db: str | Path) -> str:
    """A database URL, or a SQLite file path (the embedded default for one machine)."""
    text = str(db)
    if "://" in text:
        for alias in ("postgresql://", "postgres://"):  # libpq's two spellings, as VSE_HISTORY_URL may hold either
            if text.startswith(alias):
                return "postgresql+psycopg://" + text[len(alias) :]
        return text
    parent = Path(text).parent
    if not parent.is_dir():  # a typo in a path would otherwise grow folders where none should be
        raise HistoryError(f"--db {text}: the folder {parent} does not exist")
    return f"sqlite:///{text}"


def connect(db: str | Path) -> sa.Engine:
    """The history, its schema created or brought to the newest revision (Alembic)."""
    if not str(db).strip():
        raise HistoryError(
            "the history database is empty: give --db a SQLite path or a postgresql:// URL "
            "(the nightly's is VSE_HISTORY_URL, an agent secret)"
        )
    engine = sa.create_engine(url_of(db))
    try:
        with engine.begin() as c:
            if engine.dialect.name == "postgresql":  # agents starting at once: one migrates, the others wait
                c.execute(sa.text("SELECT pg_advisory_xact_lock(7315)"))
            _migrate(c)
    except sa.exc.OperationalError as e:
        raise HistoryError(f"the history database at {where(engine.url)} cannot be reached: {_first_line(e)}") from None
    return engine


def where(url: sa.URL) -> str:
    """Where a database is, never with its credentials (a URL from an agent secret)."""
    if url.get_backend_name() == "sqlite":
        return str(url.database)
    return f"{url.get_backend_name()} {url.host or 'localhost'}:{url.port or 5432}/{url.database or ''}"


def _first_line(e: sa.exc.OperationalError) -> str:
    text = str(e.orig).strip().splitlines()
    return text[0][:300] if text else type(e.orig).__name__


def _migrate(c: sa.Connection) -> None:
    """Alembic's upgrade to the newest revision, in-process on this connection. A history from
    before Alembic has no version table: revision 0001 brings it to its shape, keeping its rows."""
    from alembic import command
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.attributes["connection"] = c
    command.upgrade(cfg, "head")
