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


def test_interleave_plans_a_fresh_server_per_repeat_alternating_arms(tmp_path, monkeypatch):
    from eval.scenario import load_scenario
    calls = []
    monkeypatch.setattr(compare.Orchestrator, "prepare", lambda self: None)
    monkeypatch.setattr(compare.Orchestrator, "run_arm",
                        lambda self, arm, repeats, with_checks: calls.append((arm, list(repeats), with_checks)))
    s = load_scenario("scenarios/cpu-smoke.yaml", overrides=["run.interleave=true", "workload.repeats=3",
                                                             "run.order=[candidate, baseline]"])
    opts = compare.CompareOptions(reports_root=tmp_path)
    s, run_dir = compare.start_run(s, opts)
    compare.run_compare(s, run_dir, opts)
    assert calls == [("candidate", [0], True), ("baseline", [0], True), ("candidate", [1], False),
                     ("baseline", [1], False), ("candidate", [2], False), ("baseline", [2], False)]
    assert json.loads((run_dir / "run.json").read_text())["status"] == "complete"
