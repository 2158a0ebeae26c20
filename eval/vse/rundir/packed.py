"""Committed examples: a run directory whose raw data is packed as raw.tar.xz (benchmarks/
pack_example.py packs them). `unpack` makes it a run directory again, for reports and history.

A large archive does not stay in the working tree: raw.json beside the reports names it (its
sha256, size, and the git blob and commit that hold it), and `raw_archive` finds it, in order, as
raw.tar.xz beside raw.json (restored earlier), in $VSE_EXAMPLES_RAW/<sha256>.tar.xz (a folder
outside the repository: an artifact store, a shared disk), or in the repository's own history
(`git cat-file`), checked against its sha256 and kept as raw.tar.xz (git-ignored) for next time."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

from vse.errors import SuiteError
from vse.rundir.files import atomic_write_bytes
from vse.rundir.layout import RunDir

_NAMES = RunDir(Path("."))
REPORT_FILES = (_NAMES.summary.name, _NAMES.results.name, _NAMES.html.name)
ARCHIVE, POINTER = "raw.tar.xz", "raw.json"
STORE_ENV = "VSE_EXAMPLES_RAW"


def is_packed(path: Path) -> bool:
    """A committed example still packed (an unpacked copy keeps raw.tar.xz beside its records)."""
    path = Path(path)
    return ((path / ARCHIVE).is_file() or (path / POINTER).is_file()) and not any(
        arm.record_files() for arm in RunDir(path).arm_dirs()
    )


def _from_git(example: Path, blob: str) -> bytes | None:
    try:
        out = subprocess.run(["git", "-C", str(example), "cat-file", "blob", blob], capture_output=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def raw_archive(example: Path) -> Path:
    """The example's raw.tar.xz, restored from where raw.json says it lives if it is not here."""
    example = Path(example)
    here = example / ARCHIVE
    if here.is_file() or not (example / POINTER).is_file():
        return here
    ptr = json.loads((example / POINTER).read_text())
    store = os.environ.get(STORE_ENV)
    stored = Path(store) / f"{ptr['sha256']}.tar.xz" if store else None
    data = stored.read_bytes() if stored and stored.is_file() else _from_git(example, ptr["blob"])
    if data is None:
        raise SuiteError(
            f"{example}: its raw data ({ptr['bytes']} bytes) is not here: it lives in git history (blob "
            f"{ptr['blob'][:12]}, commit {ptr['commit'][:12]}), which this checkout lacks (a shallow clone: "
            f"git fetch --unshallow), or in ${STORE_ENV}/{ptr['sha256']}.tar.xz"
        )
    if hashlib.sha256(data).hexdigest() != ptr["sha256"]:
        raise SuiteError(f"{example}: the raw data found does not match raw.json's sha256 {ptr['sha256'][:12]}")
    atomic_write_bytes(here, data)
    return here


def unpack(example: Path, dest: Path, name: str | None = None) -> Path:
    """A committed example as a run directory again (raw data extracted, reports left out)."""
    run = dest / (name or example.name)
    archive = raw_archive(example)
    shutil.copytree(example, run, ignore=shutil.ignore_patterns(*REPORT_FILES, ARCHIVE, POINTER))
    with tarfile.open(archive) as t:
        t.extractall(run, filter="data")
    if (run / "baseline-from.json").is_file():  # the run reused that example's baseline arm (BASE_RUN)
        src = example.parent / json.loads((run / "baseline-from.json").read_text())["example"]
        with tarfile.open(raw_archive(src)) as t:
            shared = ("baseline/",) + (() if (run / "reference").is_dir() else ("reference/",))
            t.extractall(run, members=[m for m in t.getmembers() if m.name.startswith(shared)], filter="data")
    return run
