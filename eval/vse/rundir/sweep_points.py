"""Load sweeps (run.sweep): more load points measured on the same server starts as the scenario's
own. Each point is kept as a run directory of its own under <run>/sweep/, so the same analysis
and reports apply to it unchanged; its records are written there by the orchestrator."""

from __future__ import annotations

import shutil
from pathlib import Path

import yaml

from vse import exitcodes
from vse.redaction import redact, secret_values
from vse.rundir import seal
from vse.rundir.files import read_json, write_json
from vse.rundir.layout import RunDir
from vse.scenario import ARMS, AccuracySpec, AgreementSpec, Scenario, SweepSpec, dump


def _spec(s: Scenario) -> SweepSpec:
    if s.run.sweep is None:
        raise ValueError(f"{s.name}: not a sweep (run.sweep is not set)")
    return s.run.sweep


def point_label(s: Scenario, v: float) -> str:
    return _spec(s).label(v)


def point_dir(run_dir: Path, s: Scenario, v: float) -> Path:
    return RunDir(run_dir).sweep_point(_spec(s).label(v).replace("=", "-"))


def point_dirs(run_dir: Path, s: Scenario) -> list[tuple[str, Path]]:
    """(label, directory) of every point of the sweep that has a directory, in sweep order."""
    if s.run.sweep is None:
        return []
    return [(s.run.sweep.label(v), d) for v in s.run.sweep.values if (d := point_dir(run_dir, s, v)).is_dir()]


def point_scenario(s: Scenario, v: float) -> Scenario:
    """The scenario as one point measures it: the swept workload setting, no further sweep, and
    neither accuracy nor agreement (properties of the server, checked once at the run's own point)."""
    key = _spec(s).key
    w = s.workload.model_copy(update={key: int(v) if key == "max_concurrency" else float(v)})
    return s.model_copy(
        update={
            "name": f"{s.name} @ {_spec(s).label(v)}",
            "workload": w,
            "accuracy": AccuracySpec(enabled=False),
            "agreement": AgreementSpec(enabled=False),
            "run": s.run.model_copy(update={"sweep": None, "gemm_bench": False}),
        }
    )


def prepare(run_dir: Path, s: Scenario, v: float) -> Path:
    """The point's directory with its scenario (written once), ready for its records."""
    d = point_dir(run_dir, s, v)
    if not RunDir(d).scenario.is_file():
        d.mkdir(parents=True, exist_ok=True)
        ps = point_scenario(s, v)
        RunDir(d).scenario.write_text(yaml.safe_dump(redact(dump(ps), secret_values(ps)), sort_keys=False))
    return d


def sync(run_dir: Path, s: Scenario) -> None:
    """Copy what the points share with the run (its status, environment and servers) into each
    point, so each reads as a run directory. Called when the run ends, however it ends."""
    run = RunDir(run_dir)
    for _, d in point_dirs(run_dir, s):
        point = RunDir(d)
        for src, dst in ((run.run_json, point.run_json), (run.environment, point.environment)):
            if src.is_file():
                shutil.copy(src, dst)
        for arm in ARMS:
            if run.arm(arm).servers.is_file() and point.arm(arm).path.is_dir():
                write_json(point.arm(arm).servers, read_json(run.arm(arm).servers))
                # the point's seal begins here, with what it holds (its records are written while it has
                # no run.json, so unsealed until now) and its scenario
                seal.add(d, [point.arm(arm).servers, point.scenario])


def worst_exit(codes: list[int]) -> int:
    """The run's exit code over its points, in the one severity order (eval/vse/exitcodes.py)."""
    return exitcodes.worst(codes)
