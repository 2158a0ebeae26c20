"""A run resumed on another machine says so: every server start records the machine it ran on."""

from types import SimpleNamespace

from vse.analysis import machine_notes
from vse.rundir.files import machine_id


def test_machine_id_is_stable_on_one_boot():
    a = machine_id()
    assert a == machine_id() and len(a) == 12 and int(a, 16) >= 0


def test_a_run_whose_arms_ran_on_two_machines_is_noted():
    arm = lambda *ms: SimpleNamespace(servers=[{"machine": m} for m in ms])
    assert machine_notes({"baseline": arm("aaa", "aaa"), "candidate": arm("aaa", "aaa")}) == []
    assert machine_notes({"baseline": arm(None), "candidate": arm(None)}) == []  # recorded before machine ids
    (note,) = machine_notes({"baseline": arm("aaa"), "candidate": arm("bbb", "aaa")})
    assert note.startswith("server starts ran on 2 different machines")
    assert "candidate: start 1 on bbb, start 2 on aaa" in note


def test_a_start_that_only_made_up_checks_is_not_counted_as_a_measured_start(tmp_path):
    """As on the H200 what-if run: the candidate's checks were made up on a second machine by a
    start that ran no workload. It is named as such, not as 'start 3'."""
    import json

    from vse.analysis import load_arm
    from vse.orchestration.scenario_check import load_scenario

    d = tmp_path / "candidate"
    d.mkdir()
    (d / "servers.json").write_text(json.dumps([{"server": 2, "machine": "aaa"}, {"server": 6, "machine": "bbb"}]))
    (d / "bench-0.meta.json").write_text(json.dumps({"repeat": 0, "server_start": 0, "server": 2}))
    (d / "bench-0.jsonl").write_text("")
    a = load_arm(tmp_path, "candidate", load_scenario("scenarios/cpu-smoke.yaml"))
    assert [sv["measured"] for sv in a.servers] == [True, False]
    (note,) = machine_notes({"baseline": SimpleNamespace(servers=[{"machine": "aaa"}]), "candidate": a})
    assert "candidate: start 1 on aaa, checks only on bbb" in note


def test_measured_starts_after_a_make_up_start_keep_their_own_numbers():
    """A resume makes up lost checks first, then measures on: that start is not counted in the numbering."""
    servers = [
        {"machine": "aaa", "measured": True},
        {"machine": "bbb", "measured": False},
        {"machine": "bbb", "measured": True},
    ]
    (note,) = machine_notes(
        {"baseline": SimpleNamespace(servers=[{"machine": "aaa"}]), "candidate": SimpleNamespace(servers=servers)}
    )
    assert "candidate: start 1 on aaa, checks only on bbb, start 2 on bbb." in note
