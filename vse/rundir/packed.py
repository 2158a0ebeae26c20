"""Committed examples: a run directory whose raw data is packed as raw.tar.xz (benchmarks/
pack_example.py packs them). `unpack` makes it a run directory again, for reports and history."""

from __future__ import annotations

import json
import shutil
import tarfile
from pathlib import Path

from vse.rundir.layout import RunDir

_NAMES = RunDir(Path("."))
REPORTS = (_NAMES.summary.name, _NAMES.results.name, _NAMES.html.name)


def is_packed(path: Path) -> bool:
    """A committed example still packed (an unpacked copy keeps raw.tar.xz beside its records)."""
    return (Path(path) / "raw.tar.xz").is_file() and not any(
        RunDir(path).arm(d.name).record_files() for d in Path(path).iterdir() if d.is_dir()
    )


def unpack(example: Path, dest: Path, name: str | None = None) -> Path:
    """A committed example as a run directory again (raw data extracted, reports left out)."""
    run = dest / (name or example.name)
    shutil.copytree(example, run, ignore=shutil.ignore_patterns(*REPORTS))
    with tarfile.open(run / "raw.tar.xz") as t:
        t.extractall(run, filter="data")
    if (run / "baseline-from.json").is_file():  # the run reused that example's baseline arm (BASE_RUN)
        src = example.parent / json.loads((run / "baseline-from.json").read_text())["example"]
        with tarfile.open(src / "raw.tar.xz") as t:
            shared = ("baseline/",) + (() if (run / "reference").is_dir() else ("reference/",))
            t.extractall(run, members=[m for m in t.getmembers() if m.name.startswith(shared)], filter="data")
    return run
