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
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

# How long a cancelled child may take to stop its servers (a vLLM server's own stop is bounded
# well inside this) before it is killed.
STOP_WAIT_S = 180


def argv(args: list[str]) -> list[str]:
    return [sys.executable, "-m", "vse.cli", *args]


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


@contextmanager
def running(cmd: list[str], **popen: Any) -> Iterator[subprocess.Popen]:
    """The process, waited for at the block's end. A cancel meanwhile, or any other exception in the
    block (a full disk while its console is written), stops it first (stop), then goes on: a child
    left running would hold its servers with no one reading it. Its pipes stay open until it has ended."""
    proc = subprocess.Popen(cmd, **popen)
    try:
        yield proc
        proc.wait()
    except BaseException:
        stop(proc)
        raise
    finally:
        for pipe in (proc.stdin, proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()


def run(args: list[str]) -> int:
    """`python -m vse.cli ARGS` to its end (its output on this process's), its exit code."""
    with running(argv(args)) as proc:
        pass
    return proc.returncode
