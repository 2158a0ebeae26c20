"""A `vse` command run as a child of another (bisect's steps, calibrate's and qualify's comparisons).

A cancel (Ctrl-C, SIGTERM from a CI agent, a closed terminal) must reach the child and be waited
out: the child then stops its servers and marks its run interrupted, which `--resume` continues.
subprocess.run would SIGKILL it 0.25 s after the parent's KeyboardInterrupt, and Popen's context
exit closes its output pipe under it: the run would say "running" for ever and its servers would
be stopped only by their watchdog."""

from __future__ import annotations

import signal
import subprocess
import sys
from typing import Any

# How long a cancelled child may take to stop its servers (a vLLM server's own stop is bounded
# well inside this) before it is killed.
STOP_WAIT_S = 180


def argv(args: list[str]) -> list[str]:
    return [sys.executable, "-m", "vse.cli", *args]


def start(args: list[str], **popen: Any) -> subprocess.Popen:
    return subprocess.Popen(argv(args), **popen)


def stop(proc: subprocess.Popen) -> None:
    """After a cancel of this process: the child is told (a signal the whole process group already
    had reads as the same stop to it) and given STOP_WAIT_S to stop its servers, then killed."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def wait(proc: subprocess.Popen) -> int:
    """The child's exit code; a cancel meanwhile stops it first (stop), then goes on."""
    try:
        return proc.wait()
    except KeyboardInterrupt:
        stop(proc)
        raise


def run(args: list[str]) -> int:
    """`python -m vse.cli ARGS` to its end (its output on this process's), its exit code."""
    return wait(start(args))
