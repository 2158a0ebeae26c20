"""One comparison at a time per device: a second one on the same machine and GPUs would share
its cores and GPUs with the first, and both verdicts would carry that skew silently. The lock is
the kernel's (flock): it goes with the process that holds it, however that process ends.

What is locked is what the devices are, not how this process names them: each GPU the servers
will use by its UUID (CUDA_VISIBLE_DEVICES may say 0 in one agent and the UUID in another), and
the machine itself. A CPU comparison takes the machine alone; a GPU comparison shares the machine
with other GPU comparisons (8 agents on an 8-GPU host) and takes its own GPUs alone. The files
live where every user and job of the machine looks (/tmp, or VSE_LOCK_DIR), whatever TMPDIR says,
and are created writable by all, so another user's comparison is refused too."""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from vse.errors import DevicesBusyError

SHARED_DIR = "/tmp"  # not tempfile.gettempdir(): a job's own TMPDIR would give it a lock of its own


def lock_dir() -> Path:
    """VSE_LOCK_DIR where jobs run in containers (each has a /tmp of its own): a folder of the host
    every container mounts (the pipelines set the per-host cache volume's locks/)."""
    d = Path(os.environ.get("VSE_LOCK_DIR") or SHARED_DIR)
    d.mkdir(parents=True, exist_ok=True)
    return d


def _path(name: str) -> Path:
    return lock_dir() / f"vse-compare-{re.sub(r'[^0-9A-Za-z-]', '_', name)}.lock"


@dataclass
class DeviceLock:
    """The open lock files; the devices stay locked while this object lives."""

    files: list[IO[str]] = field(default_factory=list)

    def close(self) -> None:
        for f in self.files:
            f.close()
        self.files.clear()


def _open(path: Path) -> IO[str]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    with contextlib.suppress(PermissionError):  # created by another user: they set its mode
        os.fchmod(fd, 0o666)  # the umask's bits back: another user's comparison opens it too
    return os.fdopen(fd, "r+")


def _take(lock: DeviceLock, name: str, exclusive: bool, what: str, wait_s: float = 0.0, log=None) -> None:
    path = _path(name)
    f = _open(path)
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(f, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "another process"
            if time.monotonic() < deadline:
                if log is not None:
                    log(f"waiting up to {wait_s:.0f} s for the devices ({holder} holds {path})")
                    log = None  # said once
                time.sleep(min(POLL_S, max(deadline - time.monotonic(), 0.01)))
                continue
            f.close()
            lock.close()
            waited = f" for {wait_s:.0f} s" if wait_s else ""
            raise DevicesBusyError(
                f"another comparison is running on this machine's devices ({holder}; lock {path}){waited}: two "
                "at once would skew each other's numbers. Wait for it to end (--wait-lock SECONDS), or stop it"
            ) from None
    f.seek(0)  # a shared lock names its latest holder
    f.truncate()
    f.write(f"pid {os.getpid()}: {what}")
    f.flush()
    lock.files.append(f)


POLL_S = 1.0  # how often a waiting comparison tries the lock again


def acquire(what: str, gpu_uuids: list[str] | None = None, wait_s: float = 0.0, log=None) -> DeviceLock:
    """Hold the devices' locks for as long as the returned object lives. Where another comparison
    has one: wait up to wait_s for it (said once through log), then refuse naming it
    (DevicesBusyError). gpu_uuids: the GPUs the servers will use (None or empty: a CPU comparison,
    which takes the whole machine)."""
    lock = DeviceLock()
    deadline = time.monotonic() + wait_s
    _take(lock, "machine", exclusive=not gpu_uuids, what=what, wait_s=wait_s, log=log)
    for uuid in sorted(gpu_uuids or []):
        _take(lock, f"gpu-{uuid}", exclusive=True, what=what, wait_s=max(deadline - time.monotonic(), 0), log=log)
    return lock
