"""The central history on a real PostgreSQL server (Debian's postgresql, started here in a temporary
cluster): schema created by the suite, ingest from several writers at once (the nightly's agents),
the same run ingested twice at once going in once, and the trend read back."""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
from conftest import ROOT

from vse.errors import tail
from vse.rundir.packed import unpack

BIN = sorted(glob.glob("/usr/lib/postgresql/*/bin"))
pytestmark = pytest.mark.skipif(not BIN, reason="Debian's postgresql is not installed (.ci/run installs it)")


def _as_postgres(cmd: str) -> list[str]:
    return ["su", "postgres", "-s", "/bin/sh", "-c", cmd] if os.geteuid() == 0 else ["sh", "-c", cmd]


@pytest.fixture(scope="module")
def pg_url():
    d = Path(tempfile.mkdtemp(prefix="vse-pg-"))  # under /tmp itself: pytest's own temp is root-only
    if os.geteuid() == 0:
        shutil.chown(d, "postgres")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    b = BIN[-1]
    subprocess.run(_as_postgres(f"{b}/initdb -D {d}/data -A trust -U vse >/dev/null"), check=True, timeout=120)
    subprocess.run(
        _as_postgres(
            f"{b}/pg_ctl -D {d}/data -l {d}/log -w -o '-p {port} -k {d} -c listen_addresses=127.0.0.1' start >/dev/null"
        ),
        check=True,
        timeout=120,
    )
    try:
        subprocess.run(_as_postgres(f"{b}/createdb -h 127.0.0.1 -p {port} -U vse history"), check=True, timeout=60)
        yield f"postgresql://vse@127.0.0.1:{port}/history"
    finally:
        subprocess.run(_as_postgres(f"{b}/pg_ctl -D {d}/data -m fast stop >/dev/null"), timeout=120)
        shutil.rmtree(d, ignore_errors=True)


def test_several_writers_ingest_into_one_postgres_history_and_the_trend_reads_it(pg_url, tmp_path):
    ex = ROOT / "reports" / "examples"
    runs = [unpack(ex / "cpu-smoke", tmp_path, "night-1"), unpack(ex / "cpu-smoke-aa", tmp_path, "night-2")]
    # four writers at once: each run twice, as two agents retrying would
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "vse.cli", "history", "--db", pg_url, str(r)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in runs + runs
    ]
    outs = [p.communicate(timeout=600) for p in procs]
    assert all(p.returncode == 0 for p in procs), [tail(o[1], 1500) for o in outs]
    said = "".join(o[0] for o in outs)  # the walk's lines are on stdout
    assert said.count("8 run-level rows added") == 2 and said.count("already in the history") == 2
    engine = sa.create_engine(pg_url.replace("postgresql://", "postgresql+psycopg://"))
    with engine.connect() as c:
        assert c.execute(sa.text("SELECT COUNT(*) FROM runs")).scalar() == 16
        assert c.execute(sa.text("SELECT COUNT(DISTINCT run) FROM gates")).scalar() == 2
    t = time.monotonic()
    r = subprocess.run(
        [sys.executable, "-m", "vse.cli", "trend", "--db", pg_url, "--out", str(tmp_path / "trend")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode in (0, 1), tail(r.stderr)
    md = (tmp_path / "trend" / "trend.md").read_text()
    assert "cpu-smoke / baseline fp32 (none)" in md and time.monotonic() - t < 600
    assert Path(tmp_path / "trend" / "trend.html").is_file()
