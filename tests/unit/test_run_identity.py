"""A run is named by its run.json, written when it starts, not by the folder it is found in: a
run directory copied or moved under another name still reports as the run it was."""

import json
import shutil

from rundirs import write_run

from vse.analysis import analyze
from vse.report import markdown
from vse.rundir.files import RunStatus


def test_run_json_records_the_runs_name_at_its_start(tmp_path):
    d = tmp_path / "20261207T000000Z-cpu-smoke-none"
    d.mkdir()
    RunStatus(d)
    assert json.loads((d / "run.json").read_text())["run"] == d.name


def test_a_moved_run_still_reports_as_the_run_it_was(tmp_path):
    run = write_run(
        tmp_path / "20261207T000000Z-original",
        {"baseline": [(0, 10.0), (1, 10.0)], "candidate": [(0, 10.0), (1, 10.0)]},
    )
    data = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps({**data, "run": run.name}))
    moved = shutil.move(str(run), str(tmp_path / "copy of it"))
    a = analyze(moved)
    assert a.run_id == "20261207T000000Z-original"
    assert "run `20261207T000000Z-original`" in markdown.render(a)
