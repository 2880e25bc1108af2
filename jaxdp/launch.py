"""`jaxdp train --processes P`: start P processes of this same command on this machine, each one a
`jax.distributed` process (coordinator on a free loopback port, CPU collectives through gloo).

Nothing here is a protocol of our own: the children are ordinary `jaxdp train --coordinator HOST:PORT
--num-processes P --process-id I` runs, exactly what one would start by hand on P hosts of a
cluster. The launcher only starts them and watches them: when one fails, the others are stopped and
the launcher exits with the failed process's status, so a dead process never leaves the rest hanging.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

POLL_S = 0.2
GRACE_S = 5.0
FIRST_CAUSE_S = 1.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(argv: list[str], processes: int, timeout_s: float | None = None) -> int:
    """Run `python -m jaxdp <argv>` as `processes` jax.distributed processes; returns the exit status."""
    coordinator = f"127.0.0.1:{free_port()}"
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    children = []
    for pid in range(processes):
        cmd = [sys.executable, "-m", "jaxdp", *argv, "--coordinator", coordinator,
               "--num-processes", str(processes), "--process-id", str(pid)]
        children.append(subprocess.Popen(cmd, env=env, stdout=None if pid == 0 else subprocess.DEVNULL))
        print(f"jaxdp: started process {pid} (pid {children[-1].pid})", file=sys.stderr, flush=True)
    start = time.monotonic()
    try:
        while True:
            codes = [c.poll() for c in children]
            failed = [(i, code) for i, code in enumerate(codes) if code not in (None, 0)]
            if failed:
                # Peers of a dead process fail too (their connections close), sometimes first: wait a
                # moment, then blame a process killed by a signal before one that merely saw it go.
                time.sleep(FIRST_CAUSE_S)
                failed = [(i, c.poll()) for i, c in enumerate(children) if c.poll() not in (None, 0)]
                i, code = min(failed, key=lambda ic: (ic[1] > 0, ic[0]))
                how = f"was killed by signal {-code}" if code < 0 else f"exited with status {code}"
                others = "".join(f"; process {j} exited with status {c}" for j, c in failed if j != i)
                print(f"jaxdp: error: process {i} {how}{others}; stopping the other processes",
                      file=sys.stderr, flush=True)
                return code if code > 0 else 1
            if all(code == 0 for code in codes):
                return 0
            if timeout_s is not None and time.monotonic() - start > timeout_s:
                print(f"jaxdp: error: the run exceeded {timeout_s:.0f}s; stopping it", file=sys.stderr, flush=True)
                return 124
            time.sleep(POLL_S)
    finally:
        _stop(children)


def _stop(children) -> None:
    for c in children:
        if c.poll() is None:
            c.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + GRACE_S
    for c in children:
        try:
            c.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            c.kill()
            c.wait()
