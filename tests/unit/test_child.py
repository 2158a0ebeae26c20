"""A cancelled parent (bisect, calibrate, qualify) waits for its child comparison to stop: the child's
own stop (its servers, its run marked interrupted) must finish, not be killed 0.25 s in, as
subprocess.run does (the planted case below shows that it would be)."""

import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import ROOT

# A child whose stop takes a second (as a comparison's stopping its servers does), then says so.
CHILD = """
import signal, sys, time
from pathlib import Path
out = Path(sys.argv[1])
def stop(*_):
    time.sleep(1.0)
    out.write_text("stopped")
    sys.exit(5)
signal.signal(signal.SIGTERM, stop)
signal.signal(signal.SIGINT, stop)
out.write_text("ready")
time.sleep(60)
"""

# The parent: a suite command whose SIGTERM is a KeyboardInterrupt (vse.cli's main), running the child.
PARENT = """
import signal, subprocess, sys
from vse.orchestration import child

def interrupt(*_):
    raise KeyboardInterrupt

signal.signal(signal.SIGTERM, interrupt)
cmd = [sys.executable, "-c", sys.argv[2], sys.argv[3]]
try:
    if sys.argv[1] == "child.running":
        with child.running(cmd) as p:
            pass
    else:  # the planted fault: what subprocess.run does on an interrupt
        p = subprocess.Popen(cmd)
        try:
            p.wait()
        except KeyboardInterrupt:
            p.kill()
            raise
except KeyboardInterrupt:
    print(f"parent cancelled; child exit {p.wait()}", flush=True)
    sys.exit(2)
"""


@pytest.mark.parametrize("group", [False, True], ids=["the parent alone", "the whole process group"])
@pytest.mark.parametrize("how", ["child.running", "kill (subprocess.run)"])
def test_a_cancel_lets_the_child_finish_its_own_stop(tmp_path, how, group):
    said = tmp_path / "child"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "eval")}
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, how, CHILD, str(said)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    deadline = time.monotonic() + 30
    while not said.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert said.read_text() == "ready"
    if group:  # a CI agent's cancel, or Ctrl-C in a terminal: every process of the group gets it
        os.killpg(parent.pid, signal.SIGTERM)
    else:  # `kill PID` of the parent alone: the child hears of it only from the parent
        parent.send_signal(signal.SIGTERM)
    out, _ = parent.communicate(timeout=30)
    assert parent.returncode == 2
    if how == "child.running":
        assert said.read_text() == "stopped" and "child exit 5" in out
    else:
        assert said.read_text() == "ready" and "child exit -9" in out


# The parent fails inside the block on its own (as qualify's console write does on a full disk).
FAILING_PARENT = """
import subprocess, sys, time
from vse.orchestration import child

cmd = [sys.executable, "-c", sys.argv[1], sys.argv[2]]
try:
    with child.running(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) as p:
        while open(sys.argv[2]).read() != "ready":
            time.sleep(0.05)
        raise OSError("No space left on device")
except OSError:
    print(f"parent failed; child exit {p.poll()}", flush=True)
"""


def test_a_failure_inside_the_block_stops_the_child_too(tmp_path):
    said = tmp_path / "child"
    said.write_text("")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "eval")}
    out = subprocess.run(
        [sys.executable, "-c", FAILING_PARENT, CHILD, str(said)],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
    ).stdout
    # Without the stop the child would still be asleep (exit None) and say "ready" for a minute.
    assert "child exit 5" in out and said.read_text() == "stopped"
