"""A pytest plugin for the suite's budget: each test's CPU seconds (this process and the children it
waited for: CLI subprocesses, torch ranks through their fork server) and wall seconds, one line per test appended to the
file named by JAXDP_TEST_CPU, and a per-unit summary (units as conftest.py hands them to xdist's workers).

    JAXDP_TEST_CPU=/tmp/cpu.tsv python3 -m pytest -p tests.cpu_profile
    python3 -m tests.cpu_profile /tmp/cpu.tsv        # CPU per unit and per file, largest first

CPU, not wall: on a shared machine a test's wall time measures the load, its CPU time the test. A
session-cached world or run is charged to the first test that needs it."""
from __future__ import annotations

import collections
import os
import resource
import sys
import time

import pytest


def _servers() -> float:
    """CPU seconds of this process's running fork servers (torch_ref's ranks are their children, reaped by
    them: utime, stime, cutime, cstime of /proc/PID/stat), which RUSAGE_CHILDREN counts only once they exit."""
    me, total = os.getpid(), 0.0
    try:
        children = open(f"/proc/{me}/task/{me}/children").read().split()
    except OSError:
        return 0.0
    for pid in children:
        try:
            if b"forkserver" in open(f"/proc/{pid}/cmdline", "rb").read():
                fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
                total += sum(int(v) for v in fields[11:15]) / os.sysconf("SC_CLK_TCK")
        except (OSError, ValueError):
            continue
    return total


def _cpu() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime + _servers()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    out = os.environ.get("JAXDP_TEST_CPU")
    cpu, wall = _cpu(), time.monotonic()
    yield
    if out:
        with open(out, "a") as f:
            f.write(f"{_cpu() - cpu:.2f}\t{time.monotonic() - wall:.2f}\t{item.nodeid}\n")


def summary(path: str, top: int = 40) -> str:
    from conftest import unit_of

    cpu, wall, count, files = (collections.Counter() for _ in range(4))
    with open(path) as f:
        for line in f:
            c, w, node = line.rstrip("\n").split("\t")
            unit = unit_of(node)
            cpu[unit] += float(c)
            wall[unit] += float(w)
            count[unit] += 1
            files[node.split("::")[0]] += float(c)
    lines = [f"{sum(cpu.values()):.0f} CPU-s, {sum(count.values())} tests", "CPU-s  wall-s  tests  unit"]
    lines += [f"{c:6.0f} {wall[u]:7.0f} {count[u]:6d}  {u}" for u, c in cpu.most_common(top)]
    lines += ["CPU-s  file"] + [f"{c:6.0f}  {f}" for f, c in files.most_common(top)]
    return "\n".join(lines)


if __name__ == "__main__":
    print(summary(sys.argv[1]))
