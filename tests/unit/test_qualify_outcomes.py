"""A release qualifies only what it ran: the worst outcome wins, and an entry that was refused,
skipped or lost makes the suite INCONCLUSIVE unless the suite marks it optional."""

import json

import pytest

from vse.exitcodes import ExitCode
from vse.orchestration import qualify

PASS, FAIL, CRASH, UNDECIDED, REFUSED = 0, 1, 2, 3, 4


def test_worst_outcome_wins():
    assert qualify.worst([(PASS, False), (UNDECIDED, False)]) == UNDECIDED
    assert qualify.worst([(UNDECIDED, False), (FAIL, False), (PASS, False)]) == FAIL
    assert qualify.worst([(FAIL, False), (CRASH, False)]) == CRASH  # a crash decided nothing: worse than a FAIL
    assert qualify.worst([]) == PASS


def test_a_refused_or_missing_entry_qualifies_nothing_unless_optional():
    assert qualify.worst([(PASS, False), (REFUSED, False)]) == UNDECIDED
    assert qualify.worst([(PASS, False), (None, False)]) == UNDECIDED
    assert qualify.worst([(PASS, False), (REFUSED, True), (None, True)]) == PASS
    assert qualify.worst([(FAIL, True)]) == FAIL  # optional never hides a regression
    assert qualify.worst([(REFUSED, False), (REFUSED, False)]) == UNDECIDED  # was PASS: nothing ran at all


def write_entry(out, i, code):
    (out / f"entry-{i}.json").write_text(
        json.dumps(
            {
                "scenario": "s",
                "backend": None,
                "set": [],
                "exit_code": code,
                "outcome": qualify.OUTCOME[code],
                "run": None,
                "message": "",
                "headline": "",
                "gates": [],
            }
        )
    )


def release(tmp_path):
    suite = qualify.load_suite("release")
    out = tmp_path / "q"
    out.mkdir()
    return suite, out


def test_the_single_gpu_release_with_tp2_and_tp4_refused_is_not_a_pass(tmp_path, monkeypatch):
    """The release list on a one-GPU agent: TP1 entries PASS, TP2 and TP4 refused (4)."""
    monkeypatch.setenv("CANDIDATE_VLLM_PYTHON", "/x/bin/python")
    suite, out = release(tmp_path)
    for i, e in enumerate(suite.runs, 1):
        write_entry(out, i, REFUSED if "tp2" in e.scenario or "tp4" in e.scenario else PASS)
    assert qualify.aggregate(suite, out) == ExitCode.INCONCLUSIVE
    md = (out / "index.md").read_text()
    assert "**INCONCLUSIVE** (exit 3)" in md and md.count("UNSUPPORTED (refused here: not qualified)") == 2


def test_an_entry_skipped_by_its_condition_is_listed_as_not_run(tmp_path, monkeypatch):
    """No Blackwell queue: the flashinfer entry's step never exists, so it leaves no result."""
    monkeypatch.setenv("CANDIDATE_VLLM_PYTHON", "/x/bin/python")
    suite, out = release(tmp_path)
    for i, e in enumerate(suite.runs, 1):
        if e.backend != "flashinfer":
            write_entry(out, i, PASS)
    (out / "entry-1.json").write_text('{"exit_code": 0, "scen')  # a step cut off mid-write: no result either
    assert qualify.aggregate(suite, out) == ExitCode.INCONCLUSIVE
    index = json.loads((out / "index.json").read_text())
    not_run = [r for r in index["runs"] if r["outcome"] == qualify.NOT_RUN]
    assert len(not_run) == 2 and all("left no result" in r["message"] for r in not_run)


@pytest.mark.parametrize("optional, expected", [(True, ExitCode.OK), (False, ExitCode.INCONCLUSIVE)])
def test_an_optional_entry_is_listed_and_not_counted(tmp_path, optional, expected):
    suite = qualify.Suite(
        name="t", runs=[qualify.Entry(scenario="a.yaml"), qualify.Entry(scenario="b.yaml", optional=optional)]
    )
    out = tmp_path / "q"
    out.mkdir()
    write_entry(out, 1, PASS)
    write_entry(out, 2, REFUSED)
    assert qualify.aggregate(suite, out) == expected
    assert ("optional: listed, not counted" in (out / "index.md").read_text()) is optional


def test_a_broken_entry_refuses_the_whole_suite_before_its_first_entry_runs(tmp_path, monkeypatch, capsys):
    """A typo in the last entry used to cost every entry before it (four server starts) and an emitted
    pipeline uploaded a step for it; now both refuse in seconds, naming the entry."""
    from vse import cli

    ran = []
    monkeypatch.setattr(qualify, "run_entry", lambda *a, **k: ran.append(a) or {"exit_code": 0})
    bad = tmp_path / "broken.yaml"
    bad.write_text(
        "name: broken\nruns:\n  - {scenario: scenarios/cpu-smoke.yaml}\n"
        "  - {scenario: scenarios/cpu-smoke.yaml, set: [workload.num_promts=8]}\n"
    )
    for extra in ([], ["--emit-pipeline"]):
        code = cli.main(["qualify", "--suite", str(bad), "--reports", str(tmp_path / "r"), *extra])
        out, err = capsys.readouterr()
        assert code == 2 and ran == [] and "steps" not in out
        assert "suite broken: entry 2 (scenarios/cpu-smoke.yaml): " in err and "num_promts" in err, err
    assert not list((tmp_path / "r").glob("*qualify*"))  # no qualification folder either
    # the release list: a pipeline's step sets the candidate's Python itself; a run here needs it
    monkeypatch.delenv("CANDIDATE_VLLM_PYTHON", raising=False)
    qualify.check_entries(qualify.load_suite("release"), None)
    with pytest.raises(qualify.SuiteError, match="entry 1 .*CANDIDATE_VLLM_PYTHON is used but not set"):
        qualify.check_entries(qualify.load_suite("release"), tmp_path)
    monkeypatch.setenv("CANDIDATE_VLLM_PYTHON", "python3")
    qualify.check_entries(qualify.load_suite("release"), tmp_path)  # its GPU entries: refused here, not broken
