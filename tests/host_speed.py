"""A pytest plugin that says how fast the host was while the suite ran, so that a suite time can be read
against its machine: the same tree took 562 s and 1,102 s on two "idle" 2-core machines (docs/TESTS.md).

At the start and the end of the session the controlling process times a fixed single-threaded workload (pure
Python, the kind of work a compile is: branchy, cache-bound, one core) and reads the machine's CPU counters in
/proc/stat. The summary line then says:

    host: reference loop 0.41 s at the start, 0.43 s at the end (this tree's machine in docs/TESTS.md: 0.40 s);
    CPU busy 1,650 s of 2 cores x 560 s, stolen by the hypervisor 3 s

- the loop's time scales with the core's speed (a slow hour on a shared host, another CPU model);
- `stolen` is the time the hypervisor ran other guests on this machine's cores (a noisy neighbour);
- `busy` over the cores' wall time says whether something else ran beside the suite.
Nothing here changes a test or its time (two loops of about half a second each)."""
from __future__ import annotations

import os
import time

REFERENCE_S = 0.20  # the loop at the start of the fresh .ci/run of cfea239 (2026-12-07, 834 s for the suite)


def reference_loop() -> float:
    """Seconds for a fixed pure-Python workload (dict and integer work, one core)."""
    start = time.perf_counter()
    table: dict[int, int] = {}
    for i in range(1_500_000):
        table[i & 4095] = table.get((i * 7) & 4095, 0) + i
    return time.perf_counter() - start


def cpu_counters() -> tuple[float, float] | None:
    """(busy, stolen) CPU-seconds of the whole machine since boot, from /proc/stat; None where it is absent."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    tick = os.sysconf("SC_CLK_TCK")
    user, nice, system, _idle, _iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    return (user + nice + system + irq + softirq) / tick, steal / tick


def _controller(config) -> bool:
    return not hasattr(config, "workerinput")  # xdist's workers have it


def pytest_configure(config):
    if _controller(config):
        config._host_speed = (time.monotonic(), reference_loop(), cpu_counters())


def pytest_terminal_summary(terminalreporter, config):
    start = getattr(config, "_host_speed", None)
    if start is None:
        return
    began, loop_start, counters_start = start
    loop_end, counters_end, wall = reference_loop(), cpu_counters(), time.monotonic() - began
    line = (f"host: reference loop {loop_start:.2f} s at the start, {loop_end:.2f} s at the end (this tree's "
            f"machine in docs/TESTS.md: {REFERENCE_S:.2f} s)")
    if counters_start and counters_end:
        busy, stolen = (b - a for a, b in zip(counters_start, counters_end, strict=True))
        line += (f"; CPU busy {busy:,.0f} s of {os.cpu_count()} cores x {wall:,.0f} s, "
                 f"stolen by the hypervisor {stolen:,.0f} s")
    terminalreporter.write_line(line)
