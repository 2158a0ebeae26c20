"""A run seals its raw data as it captures it: when a run (repeat) ends, its records, their settings
and the arm's servers.json go into the run's seal.json (rewritten atomically) with their sha256,
and the records with how many measured and warm-up requests they hold; so do an arm's accuracy
result and agreement outputs when its checks end. Reading a run checks it:
a sealed file that is missing or changed, or a records file the run never sealed (a copy added
afterwards), is a damaged run, refused with the file named (report, history and resume alike).
Runs made before seals existed have none; they get the design checks alone (rawdata). A run that
seals says so in run.json (`seal`, the version) from its first moment, so a seal.json deleted later
is refused rather than read as a run from before seals; so is its scenario.yaml, sealed when the run
starts, whose margins the run is gated with. A committed example's raw data is rewritten by
benchmarks/pack_example.py (timestamps rounded), which marks run.json `packed` and leaves the seal out."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from vse.errors import DamagedRunError
from vse.rundir.files import file_sha256, read_json, write_json
from vse.rundir.layout import RunDir

VERSION = 1


def add(run_dir: Path, paths: list[Path], counts: dict[str, dict[str, int]] | None = None) -> None:
    """Seal these files of the run as they are now (the suite just wrote them); counts: per file
    name relative to the run, e.g. {"measured": 384, "warmup": 128} for a records file."""
    layout = RunDir(run_dir)
    data = read(run_dir)
    if data is None:  # a run made before seals existed and resumed now: what it holds is sealed as found
        data = {"version": VERSION, "files": {}}
        paths = [*_finished_files(layout), *paths]
    for p in paths:
        rel = str(Path(p).resolve().relative_to(layout.path.resolve()))
        data["files"][rel] = {
            "sha256": file_sha256(Path(p)),
            "size": Path(p).stat().st_size,
            **(counts or {}).get(rel, {}),
        }
    write_json(layout.seal, data)


def _finished_files(layout: RunDir) -> list[Path]:
    out = []
    for arm in layout.arm_dirs():
        out += [p for k in arm.metas() for p in (arm.records(k), arm.meta(k)) if p.is_file()]
        out += [arm.servers] if arm.servers.is_file() else []
    return out


def copy_arm(src_run: Path, dst_run: Path, arm: str) -> None:
    """Another run's arm into this one (BASE_RUN, CAND_RUN): the source is checked against its own
    seal first, and what is copied is sealed here with the counts it was sealed with there."""
    verify(src_run)
    shutil.copytree(RunDir(src_run).arm(arm).path, RunDir(dst_run).arm(arm).path)
    dst = RunDir(dst_run).arm(arm)
    was = {rel: v for rel, v in sealed(src_run).items() if Path(rel).parts[0] == arm}
    files = [p for k in dst.metas() for p in (dst.records(k), dst.meta(k)) if p.is_file()]
    files += [dst.servers] if dst.servers.is_file() else []
    files += [RunDir(dst_run).path / rel for rel in was if (RunDir(dst_run).path / rel) not in files]
    counts: dict[str, dict[str, int]] = {
        rel: {k: v[k] for k in ("measured", "warmup") if k in v} for rel, v in was.items()
    }
    add(dst_run, files, counts)


def read(run_dir: Path) -> dict[str, Any] | None:
    path = RunDir(run_dir).seal
    if not path.is_file():
        return None
    try:
        data = read_json(path)
    except ValueError as e:
        raise DamagedRunError(f"{path}: not JSON ({e}); the run directory is damaged") from None
    if not isinstance(data, dict) or not isinstance(data.get("files"), dict):
        raise DamagedRunError(f"{path}: not a seal (no files); the run directory is damaged")
    return data


def sealed(run_dir: Path) -> dict[str, dict[str, Any]]:
    """The sealed files (relative path -> sha256, size, counts); {} for a run without a seal."""
    data = read(run_dir)
    return data["files"] if data else {}


def verify(run_dir: Path) -> bool:
    """Refuses (DamagedRunError, naming the file) a run whose raw data differs from its seal.
    False for a run that has no seal (made before seals), True for one that matches it."""
    files = sealed(run_dir)
    layout = RunDir(run_dir)
    if not files:
        _refuse_a_lost_seal(layout)
        return False
    for rel, want in sorted(files.items()):
        p = layout.path / rel
        if not p.is_file():
            raise DamagedRunError(f"{p}: sealed by the run but missing; the run directory is damaged")
        try:
            got = file_sha256(p)
        except OSError as e:
            raise DamagedRunError(f"{p}: cannot be read ({e.strerror}); the run directory is damaged") from None
        if got != want["sha256"]:
            raise DamagedRunError(
                f"{p}: changed since the run sealed it (sha256 {got[:12]}, sealed {want['sha256'][:12]}); "
                "the run directory is damaged"
            )
    for arm in layout.arm_dirs():  # every finished run's files (an interrupted one has records, no meta)
        for k in arm.metas():
            for p in (arm.records(k), arm.meta(k)):
                if p.is_file() and str(p.relative_to(layout.path)) not in files:
                    raise DamagedRunError(
                        f"{p}: not in the run's seal (added after the run); the run directory is damaged"
                    )
    return True


def _refuse_a_lost_seal(layout: RunDir) -> None:
    """A run whose run.json says it sealed its data, without a seal: the seal was lost or removed."""
    try:
        run = read_json(layout.run_json) if layout.run_json.is_file() else {}
    except ValueError:
        return  # run.json's own damage is named by whoever reads it next
    if isinstance(run, dict) and run.get("seal") and not run.get("packed"):
        raise DamagedRunError(
            f"{layout.seal}: missing, though run.json says the run sealed its raw data (seal version "
            f"{run['seal']}); the run directory is damaged"
        )
