"""A run resumed on another machine says so: every server start records the machine it ran on."""

from types import SimpleNamespace

from eval.analysis import _machine_notes
from eval.rundir import machine_id


def test_machine_id_is_stable_on_one_boot():
    a = machine_id()
    assert a == machine_id() and len(a) == 12 and int(a, 16) >= 0


def test_a_run_whose_arms_ran_on_two_machines_is_noted():
    arm = lambda *ms: SimpleNamespace(servers=[{"machine": m} for m in ms])  # noqa: E731
    assert _machine_notes({"baseline": arm("aaa", "aaa"), "candidate": arm("aaa", "aaa")}) == []
    assert _machine_notes({"baseline": arm(None), "candidate": arm(None)}) == []  # recorded before machine ids
    (note,) = _machine_notes({"baseline": arm("aaa"), "candidate": arm("bbb", "aaa")})
    assert note.startswith("server starts ran on 2 different machines")
    assert "candidate: start 1 on bbb, start 2 on aaa" in note
