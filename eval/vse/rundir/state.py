"""What a run directory already holds, for a resumed run (RESUME) and a reused arm (BASE_RUN,
CAND_RUN): the server starts an arm measured, whether its checks were saved, how long its runs
took, and whether another run's arm is there to reuse. Reads files only; starts nothing."""

from __future__ import annotations

from pathlib import Path

from vse.errors import SuiteError
from vse.rundir.files import read_json
from vse.rundir.layout import RunDir
from vse.scenario import Scenario


def starts_done(run_dir: Path, arm: str) -> int:
    """Server starts of this arm with at least one finished run (a resumed run goes on after them)."""
    return len({read_json(p).get("server_start", 0) for p in RunDir(run_dir).arm(arm).metas().values()})


def next_server(run_dir: Path) -> int:
    """The number the run's next server start gets: after every recorded one, the servers of a
    reused arm included (numbered in the run they came from, so not necessarily 0..n-1)."""
    ids = [
        sv.get("server", -1) for a in RunDir(run_dir).arm_dirs() if a.servers.is_file() for sv in read_json(a.servers)
    ]
    return 1 + max(ids, default=-1)


def check_files(run_dir: Path, s: Scenario, arm: str) -> list[Path]:
    """What an arm's checks leave behind, each file written whole: the reference's scores; an arm's
    accuracy status, agreement probes (the baseline's twice) and scores."""
    d, a = RunDir(run_dir).arm(arm), s.agreement
    files = [d.accuracy_status] if s.accuracy.enabled and arm != "reference" else []
    if a.enabled:
        probes = {"reference": [], "baseline": [d.agreement, d.agreement_self]}.get(arm, [d.agreement])
        files += probes + ([d.scores] if a.reference is not None else [])
    return files


def checks_saved(run_dir: Path, s: Scenario, arm: str) -> bool:
    return all(p.is_file() for p in check_files(run_dir, s, arm))


def mean_run_s(run_dir: Path, arm: str) -> float:
    """Seconds of the arm's measured runs, on average (0 before its first)."""
    metas = [read_json(p) for p in RunDir(run_dir).arm(arm).metas().values()]
    return sum((m.get("ended_ns", 0) - m.get("started_ns", 0)) / 1e9 for m in metas) / len(metas) if metas else 0.0


def finished_exit_code(run_dir: Path) -> int | None:
    """A finished comparison's exit code, as its reports recorded it; None for one a cancel or a
    time budget stopped (`vse compare --resume` goes on with it)."""
    layout = RunDir(run_dir)
    run = read_json(layout.run_json)
    if run.get("status") != "complete" or run.get("stopped"):
        return None
    code = run.get("exit_code")
    if code is None and layout.results.is_file():
        code = read_json(layout.results).get("exit_code")
    return None if code is None else int(code)


REUSE_VAR = {"baseline": "BASE_RUN", "candidate": "CAND_RUN"}  # as the Makefile spells them


def check_reuse_source(arm: str, src_run: Path) -> None:
    """Another run's arm to reuse is there and finished: checked before a run directory exists."""
    if not RunDir(src_run).arm(arm).servers.is_file():
        raise SuiteError(f"{REUSE_VAR[arm]}={src_run}: no finished {arm} arm there; nothing was started")
