"""run.json is final however a comparison ends: its status and exit code are written together the
moment the run stops (a kill while the incomplete report is built left `exit_code: null`)."""

import json

import pytest

from vse.errors import ServerError, UnsupportedError
from vse.orchestration import compare
from vse.rundir.files import RunStatus


class Fake:
    """An orchestrator whose execute ends the way the test names."""

    def __init__(self, s, run_dir, opts, raises):
        self.status, self.raises = RunStatus(run_dir), raises

    def log(self, msg):
        pass

    def execute(self):
        raise self.raises


@pytest.mark.parametrize(
    "raises, status, code",
    [
        (KeyboardInterrupt(), "interrupted", 2),
        (ServerError("baseline server died"), "failed", 2),
        (UnsupportedError("needs 2 GPUs"), "failed", 4),
        (RuntimeError("a bug"), "failed", 2),
    ],
)
def test_every_early_ending_leaves_status_and_exit_code(tmp_path, monkeypatch, raises, status, code):
    monkeypatch.setattr(compare, "Orchestrator", lambda s, d, o: Fake(s, d, o, raises))
    monkeypatch.setattr(compare.sweep_points, "sync", lambda *a: None)
    with pytest.raises(type(raises)):
        compare.run_compare(None, tmp_path, None)
    run = json.loads((tmp_path / "run.json").read_text())
    assert (run["status"], run["exit_code"]) == (status, code)
