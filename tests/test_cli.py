"""Exit codes of the CLI where no server is needed."""

import json

from eval import cli, compare, provision


def test_a_bug_is_exit_2_with_one_line_and_the_traceback_kept(tmp_path, monkeypatch, capsys):
    def boom(self):
        raise RuntimeError("synthetic failure")
    monkeypatch.setattr(compare.Orchestrator, "execute", boom)
    monkeypatch.setattr(provision, "ensure_for", lambda *a, **k: None)
    code = cli.main(["compare", "--scenario", "scenarios/cpu-smoke.yaml", "--reports", str(tmp_path)])
    assert code == 2  # never 1, which means "a gate failed"
    (run,) = [p.parent for p in tmp_path.glob("*/run.json")]
    assert json.loads((run / "run.json").read_text())["status"] == "failed"
    assert "synthetic failure" in (run / "error.log").read_text()
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("error:")]
    assert len(err) == 1 and "RuntimeError: synthetic failure" in err[0]


def test_bad_scenario_key_is_exit_2(tmp_path, capsys):
    code = cli.main(["check", "--scenario", "scenarios/cpu-smoke.yaml", "--set", "workload.nope=1"])
    assert code == 2
    assert "workload.nope: unknown key" in capsys.readouterr().err


def test_report_of_a_non_run_is_exit_2(tmp_path, capsys):
    assert cli.main(["report", str(tmp_path)]) == 2
    assert "not a run directory" in capsys.readouterr().err
