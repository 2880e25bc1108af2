"""`jaxdp train --processes P`: start P processes of this same command on this machine, each one a
`jax.distributed` process (coordinator on a free loopback port, CPU collectives through gloo).

Nothing here is a protocol of our own: the children are ordinary `jaxdp train --coordinator HOST:PORT
--num-processes P --process-id I` runs, exactly what one would start by hand on P hosts of a
cluster. The launcher only starts them and watches them: when one fails, the others are stopped and
the launcher exits with status 3 (2 when a process refused its input), so a dead process never leaves
the rest hanging. Ctrl-C is the launcher's alone. SIGINT or SIGTERM to the launcher is forwarded to every
child as SIGTERM, JAX's preemption notice: all stop at the same step, save it, and exit 143 (`jaxdp.core.process.stop`);
a child that a signal stopped (130, 143: a notice sent to it alone reaches all of them through JAX) makes the
launcher wait for the others, then answer 130 or 143. A child not gone within STOP_S is killed.
The children die with the launcher, by any signal (`jaxdp.core.process.lifeline`), and each beats a heartbeat
file: one that stops beating for `--heartbeat` seconds (stopped, frozen), or has not started within
`--startup-timeout`, is named and the run stopped (`jaxdp.core.process.heartbeat`). The coordinator listens on
127.0.0.1 only (docs/RELIABILITY.md).
"""
from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import threading
import time

from .core.errors import EXIT_FAILED, EXIT_USAGE
from .core.process import heartbeat, last_words, lifeline, ports, progress, stop, xla_flags

POLL_S = 0.2
GRACE_S = 5.0
FIRST_CAUSE_S = 1.0
STOP_S = 8.0  # a signal's stop: the step in progress, JAX's sync (its notifier polls every 1 s), the save
HOLD_S = 1.0  # a process's stderr is shown this late: time for a peer's failure to mute it


def launch(argv: list[str], processes: int, timeout_s: float | None = None,
           heartbeat_s: float = heartbeat.DEFAULT_S, startup_s: float = heartbeat.STARTUP_S) -> int:
    """Run `python -m jaxdp <argv>` as `processes` jax.distributed processes; returns the exit status.
    Ctrl-C reaches the launcher alone (the children ignore SIGINT): it stops and reaps them, takes process
    0's progress report (`jaxdp.core.process.progress`) and raises KeyboardInterrupt for the command's one line."""
    coordinator = f"{ports.LOOPBACK}:{ports.free_port()}"
    env = {k: v for k, v in xla_flags.for_child(os.environ).items() if k != progress.ENV}
    env.update({lifeline.ENV: str(os.getpid()), heartbeat.ENV_S: str(heartbeat_s)})
    env.setdefault("PYTHONFAULTHANDLER", "1")  # a native crash prints each thread's Python stack first
    children, relays, beats = [], [], heartbeat.Watch(processes, heartbeat_s, startup_s)
    with progress.channel() as report:
        try:
            with progress.sigint_left_to_this_process():  # inherited: the children leave Ctrl-C to this process
                for pid in range(processes):
                    cmd = [sys.executable, "-m", "jaxdp", *argv, "--coordinator", coordinator,
                           "--num-processes", str(processes), "--process-id", str(pid)]
                    child_env = {**env, heartbeat.ENV_FILE: beats.path(pid), last_words.ENV: _words(beats, pid)}
                    if pid == 0:
                        child_env[progress.ENV] = report
                    children.append(subprocess.Popen(cmd, env=child_env, stderr=subprocess.PIPE,
                                                     stdout=subprocess.PIPE if pid == 0 else subprocess.DEVNULL))
                    print(f"jaxdp: started process {pid} (pid {children[-1].pid})", file=sys.stderr, flush=True)
            relays = [threading.Thread(target=_relay, args=(children[0].stdout, sys.stdout), daemon=True)]
            relays += relay_errors(children, beats)
            relays[0].start()
            code = _watch(children, timeout_s, beats)
            for relay in relays:
                relay.join(timeout=GRACE_S)
            return code
        except KeyboardInterrupt:
            with progress.sigint_deferred():  # a second Ctrl-C does not cut the stopping short
                _halt(children)
                progress.merge(report)
            raise
        finally:
            with progress.sigint_deferred():  # Ctrl-C while the children are reaped: answered (130) once they are
                _stop(children)
                for relay in relays:
                    relay.join(timeout=GRACE_S)
                progress.merge(report)
                beats.close()


# gloo's connection notice, `[Gloo] Rank 0 is connected to 1 peer ranks. Expected number of connected
# peer ranks is : 1`, which the C++ library prints on every run in pieces (one `<<` each), so that another
# thread's newline may cut it anywhere between them: CI saw `[Gloo] Rank ` and `1 is connected to 1 peer
# ranks. Expected ...` on two lines. A line made of those pieces only, in their order, is the notice's.
GLOO_NOTICE = re.compile(rb"(?:\s*(\[Gloo\]\s*)?(Rank\s*)?(\d+\s*)?(is connected to\s*)?(\d+\s*)?(peer ranks\.\s*)?"
                         rb"(Expected number of connected peer ranks is :\s*)?(\d+\s*)?){1,4}")  # up to 4 on a line


# JAX's preemption notifier's line, `W1207 05:43:22.687536 6529 preemption_notifier.cc:90] SIGTERM caught at ...`,
# on each process the launcher stopped: the launcher's one line says it.
SIGTERM_NOTICE = re.compile(rb"\S+ [\d:.]+\s+\d+ preemption_notifier\.cc:\d+\] SIGTERM caught at .*\s*")
# The same lines inside a chunk of stderr (`_relay_errors`).
SIGTERM_LINES = re.compile(rb"(?m)^\S+ [\d:.]+\s+\d+ preemption_notifier\.cc:\d+\] SIGTERM caught at .*\n?")


def notice(line: bytes) -> bool:
    """Whether a line of process 0's stdout is (a piece of) gloo's notice or blank (`jaxdp train` prints
    neither: its lines are run summaries), or a line of a child's stderr is JAX's SIGTERM notice."""
    return GLOO_NOTICE.fullmatch(line) is not None or SIGTERM_NOTICE.fullmatch(line) is not None


def _relay(pipe, out) -> None:
    """A child's stdout or stderr to this process's `out`, less gloo's connection notice and the blank line its
    separate newline sometimes leaves, and JAX's SIGTERM notice (`notice`): not the user's business."""
    for line in iter(pipe.readline, b""):
        if not notice(line):
            out.buffer.write(line)
            out.flush()


def relay_errors(children, beats: heartbeat.Watch) -> list[threading.Thread]:
    """Start relaying each child's stderr (`_relay_errors`); the threads, to join."""
    words = [_words(beats, i) for i in range(len(children))]
    threads = [threading.Thread(target=_relay_errors, args=(c.stderr, c, children, words), daemon=True)
               for c in children]
    for t in threads:
        t.start()
    return threads


def _relay_errors(pipe, me, children, words: list[str]) -> None:
    """Process `me`'s stderr (warnings, a progress bar), each piece held HOLD_S, then shown unless meanwhile a
    process has left its last words (`words`) or another has failed: from then on the launcher's one line speaks
    for the run (`last_words`), not the echoes of the failure in the failing process's threads (tensorstore's
    'Event loop is closed' tracebacks, printed just before), nor each peer's traceback or native abort as its
    connections close."""
    fd, held, done = pipe.fileno(), [], False
    while not done or held:
        if done:
            time.sleep(HOLD_S / 5)
        elif select.select([fd], [], [], HOLD_S / 5)[0]:
            chunk = os.read(fd, 1 << 16)
            done = not chunk
            held += [(time.monotonic(), chunk)] if chunk else []
        if any(_failed(c) for c in children if c is not me) or any(os.path.exists(w) for w in words):
            held.clear()
        while held and (done or time.monotonic() - held[0][0] >= HOLD_S):
            sys.stderr.buffer.write(SIGTERM_LINES.sub(b"", held.pop(0)[1]))
            sys.stderr.flush()


def _failed(child) -> bool:
    """Has `child` ended with a nonzero status (or a signal)? Asked without reaping it (the watch reaps)."""
    if child.returncode is not None:
        return child.returncode != 0
    try:
        info = os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:  # reaped by the watch meanwhile
        return child.returncode not in (None, 0)
    return info is not None and not (info.si_code == os.CLD_EXITED and info.si_status == 0)


def _watch(children, timeout_s: float | None, beats: heartbeat.Watch) -> int:
    """Wait for every child to finish (0), for one to fail or stop beating (3; 2 when it refused its input),
    or for the timeout (3)."""
    start = time.monotonic()
    while True:
        codes = [c.poll() for c in children]
        failed = [(i, code) for i, code in enumerate(codes) if code not in (None, 0)]
        if failed and all(stop.signum_of(code) for _, code in failed):  # a signal's stop: the others follow
            _halt(children, signal_them=False)
            raise stop.Stopped(min(stop.signum_of(code) for _, code in failed))  # SIGINT's 130 before SIGTERM's
        if failed:
            # Peers of a dead process fail too (their connections close), sometimes first: wait a
            # moment, then blame a process killed by a signal before one that merely saw it go.
            time.sleep(FIRST_CAUSE_S)
            failed = [(i, c.poll()) for i, c in enumerate(children) if c.poll() not in (None, 0)]
            if _stopped(children, beats, heartbeat.STALE_S):  # the first cause: its peer's failure follows
                return EXIT_FAILED
            words = {j: last_words.read(_words(beats, j)) for j, _ in failed}  # their one lines (last_words.py)
            i, code = min(failed, key=lambda ic: (_named(words[ic[0]]) > 0, ic[1] > 0, _named(words[ic[0]]), ic[0]))
            how = f"was killed by signal {-code}" if code < 0 else f"exited with status {code}"
            others = "".join(f"; process {j} exited with status {c}" for j, c in failed if j != i)
            said = words[i]
            if said is not None and said["traceback"]:  # a crash: its traceback, the first cause's only
                sys.stderr.write(said["traceback"])
            head = said["line"] if said is not None else f"jaxdp: error: process {i} {how}"
            print(f"{head}{others}; stopping the other processes", file=sys.stderr, flush=True)
            return EXIT_USAGE if code == EXIT_USAGE else EXIT_FAILED
        if all(code == 0 for code in codes):
            return 0
        if _stopped(children, beats):
            return EXIT_FAILED
        if timeout_s is not None and time.monotonic() - start > timeout_s:
            print(f"jaxdp: error: the run exceeded {timeout_s:.0f}s; stopping it", file=sys.stderr, flush=True)
            return EXIT_FAILED
        time.sleep(POLL_S)


def _words(beats: heartbeat.Watch, i: int) -> str:
    """Where process `i` leaves its last words (`jaxdp.core.process.last_words`): beside its heartbeat."""
    return os.path.join(beats.folder, f"last-words-{i}")


def _named(words: dict | None) -> int:
    """The first cause among failed processes: one that named its error (a full disk, a bad input), then one a
    signal killed, then one that crashed (its peer's failure, often: a connection reset), then one that said
    nothing."""
    return 2 if words is None else 1 if words["traceback"] else 0


def _stopped(children, beats: heartbeat.Watch, after_s: float | None = None) -> bool:
    """A running child quiet for `after_s` (default: --heartbeat) since its first beat, or (no `after_s`) one
    not started within --startup-timeout, is named, and every child killed."""
    stopped = beats.stopped([i for i, c in enumerate(children) if c.poll() is None], "process", after_s)
    if stopped is None:
        return False
    print(f"jaxdp: error: {stopped[1]}", file=sys.stderr, flush=True)
    _kill(children)  # SIGKILL: a stopped process takes no other signal
    return True


def _kill(children) -> None:
    """SIGKILL every child at once (a stopped one, or one past STOP_S), then reap them."""
    for c in children:
        if c.poll() is None:
            c.kill()
    for c in children:
        c.wait()


def _halt(children, signal_them: bool = True) -> None:
    """A stop asked by a signal: SIGTERM (JAX's preemption notice) to every child (`signal_them`), a wait of up to
    STOP_S for them to save their step and exit, then SIGKILL for any left."""
    if signal_them:
        for c in children:
            if c.poll() is None:
                c.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_S
    while any(c.poll() is None for c in children) and time.monotonic() < deadline:
        time.sleep(POLL_S / 4)
    _kill(children)


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
