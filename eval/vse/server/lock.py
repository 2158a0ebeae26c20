"""One comparison at a time per device: a second one on the same machine and GPUs would share
its cores and GPUs with the first, and both verdicts would carry that skew silently. The lock is
the kernel's (flock): it goes with the process that holds it, however that process ends."""

from __future__ import annotations

import fcntl
import os
import re
import tempfile
from pathlib import Path
from typing import IO

from vse.errors import PreflightError


def lock_path() -> Path:
    """One lock per set of visible GPUs (all of a CPU machine's cores count as one device)."""
    devices = os.environ.get("CUDA_VISIBLE_DEVICES", "all") or "none"
    return Path(tempfile.gettempdir()) / f"vse-compare-{re.sub(r'[^0-9A-Za-z,-]', '_', devices)}.lock"


def acquire(what: str) -> IO[str]:
    """Hold the device's lock for as long as the returned file stays open; refuses at once, naming
    the comparison that holds it, when another has it."""
    path = lock_path()
    f = open(path, "a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = f.read().strip() or "another process"
        f.close()
        raise PreflightError(
            f"another comparison is running on this machine's devices ({holder}; lock {path}): two at once "
            "would skew each other's numbers. Wait for it to end, or stop it"
        ) from None
    f.seek(0)
    f.truncate()
    f.write(f"pid {os.getpid()}: {what}")
    f.flush()
    return f
