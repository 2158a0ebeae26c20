"""A history made by the suite before Alembic (commit 9c999fd, the package as it was then, run from
git history), upgraded by this one: its nights keep their series, its runs are recognised when
they come again, and another run that reuses a folder name is not mistaken for one of them."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa
from conftest import ROOT

from vse.errors import tail
from vse.history import schema
from vse.history import store as history
from vse.rundir.packed import unpack

OLD = "9c999fd"  # the last suite before the history was versioned (Alembic came after it)


def _old_suite(dest: Path) -> Path:
    """The package at OLD, from git history (a shallow clone lacks it: .ci/run unshallows)."""
    dest.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", OLD, "vse"], capture_output=True, timeout=120)
    if archive.returncode != 0:
        pytest.fail(f"git archive {OLD}: {tail(archive.stderr.decode(), 500)} (a shallow clone? git fetch --unshallow)")
    subprocess.run(["tar", "x", "-C", str(dest)], input=archive.stdout, check=True, timeout=120)
    return dest


def _night_two(night_one: Path, dest: Path) -> Path:
    """Another night of the same scenario: the first night's first server start per arm only (a
    run that made fewer starts), started a day later, in a folder of the same name elsewhere."""
    shutil.copytree(night_one, dest)
    for arm in ("baseline", "candidate"):
        for meta in (dest / arm).glob("bench-*.meta.json"):
            if json.loads(meta.read_text())["server_start"] != 0:
                meta.unlink()
                meta.with_name(meta.name.replace(".meta.json", ".jsonl")).unlink()
    (dest / "seal.json").unlink(missing_ok=True)
    status = json.loads((dest / "run.json").read_text())
    status["started"] = status["started"].replace("2026-12-03", "2026-12-04")
    status.pop("seal", None)
    (dest / "run.json").write_text(json.dumps(status))
    for report in ("results.json", "summary.md"):
        (dest / report).unlink(missing_ok=True)
    return dest


def test_a_history_from_before_alembic_upgrades_without_losing_its_series_or_its_runs(tmp_path):
    old = _old_suite(tmp_path / "old")
    night_one = unpack(ROOT / "reports" / "examples" / "cpu-smoke", tmp_path / "n1", "20261203T100000Z-cpu-smoke-none")
    db = tmp_path / "history.sqlite"
    made = subprocess.run(
        [sys.executable, "-m", "vse.cli", "history", "--db", str(db), str(night_one)],
        cwd=old,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(old), "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert made.returncode == 0, tail(made.stderr)
    with sa.create_engine(f"sqlite:///{db}").connect() as c:
        assert "alembic_version" not in sa.inspect(c).get_table_names()  # the old suite's own shape
        (old_rows,) = c.execute(sa.text("SELECT count(*) FROM runs")).first()
    assert old_rows == 8

    engine = schema.connect(db)  # the upgrade: 0001, 0002, 0003
    assert history.ingest(engine, night_one, _results).added == 0  # the same run again: known
    with engine.connect() as c:
        runs = {r for (r,) in c.execute(sa.text("SELECT DISTINCT run FROM runs"))}
    assert runs == {history.run_key(night_one)}  # it now carries its content key

    # another night, in a folder of the same name: a different run, ingested
    night_two = _night_two(night_one, tmp_path / "n2" / night_one.name)
    assert history.ingest(engine, night_two, _results).added == 4

    keys = history.series_keys(engine)
    assert {(k.arm, k.label) for k in keys} == {("baseline", "fp32"), ("candidate", "bf16")}  # one series per arm
    for k in keys:
        points = history.series(engine, k, "output_throughput")
        assert [p.started[:10] for p in points] == ["2026-12-03", "2026-12-04"], k.title()


def _results(run_dir: Path) -> dict:
    from vse.report import results_json

    return results_json.current(run_dir)
