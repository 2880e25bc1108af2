"""The bench's compile child (items 4-5, `measure.Inspection`) dies with the bench: killed by `stop()`, and,
bound by `lifeline`, within moments of a bench process that dies without stopping it (SIGKILL included)."""
from __future__ import annotations

import os
import subprocess
import sys
import time

from jaxdp.harness.bench import measure
from jaxdp.harness.bench.plan import plan

PARENT = """
import sys, time
from jaxdp.harness.bench import measure
from jaxdp.harness.bench.plan import plan
child = measure.Inspection(plan(True))
print(child.proc.pid, flush=True)
time.sleep(60)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie awaiting its reaper is dead
        return f.read().split(")")[-1].split()[0] != "Z"


def test_stop_kills_the_child():
    child = measure.Inspection(plan(True))
    child.stop()
    assert child.proc.returncode is not None


def test_the_child_dies_with_a_killed_bench():
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    with parent.stdout:
        pid = int(parent.stdout.readline())
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 5  # its own work (the quick plan's compiles) takes longer
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    survived = _alive(pid)
    if survived:  # the broken run: not left behind by the test either
        os.kill(pid, 9)
    assert not survived
