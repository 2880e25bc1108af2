"""A run stopped by a signal (jaxdp/core/process/stop.py, docs/RELIABILITY.md "Round two: stop signals"):
SIGTERM (what a
scheduler sends) or SIGINT, to the launcher or to any one worker, ends the whole run within 10 s, every process
of its tree gone, with exit status 143 (SIGTERM) or 130 (SIGINT), the step in progress saved as a checkpoint whose
manifest verifies, and `--resume` from it works. Real small runs (mlp, 2 workers, no regular checkpoint),
each under a timeout; the workers' pids come from their heartbeat files, as in tests/cli/test_processes_trust.py.
In this process: the Stopped exception, the deferral in a loop, and a command's answer to SIGTERM."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import pytest

from jaxdp.core.files import manifest
from jaxdp.core.process import progress, stop, xla_flags
from jaxdp.harness.interrupt import guarded
from tests import REPO
from tests.cli.test_processes_trust import _alive, _children, _workers

RUN = ["--strategy", "ddp", "--hidden", "8,8", "--devices", "2", "--steps", "100000", "--batch-size", "8"]
EVERY = 100000  # no checkpoint but the one saved on the way out: a signal during a save cannot pass for it
COMMANDS = {"jaxdp": [sys.executable, "-m", "jaxdp", "train", *RUN, "--processes", "2"],
            "jaxdp-single": [sys.executable, "-m", "jaxdp", "train", *RUN],
            "torch_ref": [sys.executable, "-m", "torch_ref", "train", *RUN],
            "torchrun": [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                         "-m", "torch_ref", "train", *RUN[:4], *RUN[6:]]}
LINE = re.compile(r"(jaxdp|torch_ref): interrupted at step (\d+); kept checkpoint step (\d+) in \S+")
STOP_WITHIN_S = 10.0


def _tree(pid: int) -> list[int]:
    """`pid` and every process below it (from /proc)."""
    out, todo = [], [pid]
    while todo:
        out.append(todo.pop())
        todo += _children(out[-1])
    return out


def _start(tmp_path, name: str, extra=(), steps: int = 100000):
    (tmp_path / "tmp").mkdir(exist_ok=True)
    env = xla_flags.for_child(os.environ) | {"TMPDIR": str(tmp_path / "tmp"), progress.ENV: str(tmp_path / "p.json"),
                                             "OMP_NUM_THREADS": "1", "PYTHONPATH": REPO}
    argv = [str(steps) if a == "100000" else a for a in COMMANDS[name]]
    return subprocess.Popen([*argv, "--checkpoint-dir", str(tmp_path / "ck"), *extra], cwd=REPO, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)


def _past(run, tmp_path, step: int) -> int:
    """Wait until the run has done `step` steps (its progress report); returns the step it reports."""
    deadline = time.monotonic() + 240
    while progress.read(tmp_path / "p.json")[0] < step:
        assert run.poll() is None, run.stderr.read()[-3000:]
        assert time.monotonic() < deadline, "no progress"
        time.sleep(0.05)
    return progress.read(tmp_path / "p.json")[0]


def _signal(run, pid: int, signum: int) -> tuple[int, float]:
    """Send `signum` to `pid`; (the command's status, seconds until every process of its tree was gone)."""
    tree = _tree(run.pid)
    os.kill(pid, signum)
    sent = time.monotonic()
    try:
        status = run.wait(timeout=60)
        while any(map(_alive, tree)) and time.monotonic() - sent < 60:
            time.sleep(0.05)
        return status, time.monotonic() - sent
    finally:
        for p in tree:
            if _alive(p):
                os.kill(p, signal.SIGKILL)
        run.wait()


def _newest_intact(ck) -> int:
    steps = sorted(int(p.name) for p in ck.iterdir() if p.name.isdigit())
    assert steps, list(ck.iterdir())
    assert manifest.problem(ck / str(steps[-1])) is None, manifest.problem(ck / str(steps[-1]))
    return steps[-1]


def _check_stop(tmp_path, run, pid: int, signum: int, status: int) -> int:
    """Once the run is past step 3, stop it with `signum` to `pid`: its status, the tree gone in 10 s, the line, a
    checkpoint saved on the way out (at or after the step the signal found), intact. Returns its step."""
    at = _past(run, tmp_path, 3)
    code, took = _signal(run, pid, signum)
    err = run.stderr.read()
    assert code == status, err[-3000:]
    assert took < STOP_WITHIN_S, f"{took:.1f} s"
    m = LINE.search(err)
    assert m and m[2] == m[3], err[-3000:]
    newest = _newest_intact(tmp_path / "ck")
    assert newest == int(m[3]) >= at, (newest, at, err[-2000:])
    return newest


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("prog, target, signum, status", [
    ("jaxdp", "launcher", signal.SIGTERM, 143), ("jaxdp", "worker", signal.SIGTERM, 143),
    ("jaxdp", "worker", signal.SIGINT, 130), ("torch_ref", "launcher", signal.SIGTERM, 143),
    ("torch_ref", "worker", signal.SIGTERM, 143), ("torch_ref", "worker", signal.SIGINT, 130)])
def test_a_signal_stops_the_whole_run_and_keeps_its_step(prog, target, signum, status, tmp_path):
    run = _start(tmp_path, prog, ["--checkpoint-every", str(EVERY)])
    pids = _workers(tmp_path, run)
    newest = _check_stop(tmp_path, run, run.pid if target == "launcher" else pids[1], signum, status)
    if (target, signum) == ("worker", signal.SIGTERM):  # resumed from the step saved on the way out
        again = _start(tmp_path, prog, ["--checkpoint-every", str(EVERY), "--resume"], steps=newest + 2)
        _, err = again.communicate(timeout=240)
        assert again.returncode == 0, err[-3000:]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_sigterm_stops_a_single_process_run_with_its_step_saved(tmp_path):
    run = _start(tmp_path, "jaxdp-single", ["--checkpoint-every", str(EVERY)])
    _check_stop(tmp_path, run, run.pid, signal.SIGTERM, 143)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_sigterm_to_one_torchrun_worker_stops_every_rank_at_one_step(tmp_path):
    """Under torchrun (no launcher of ours): the ranks agree on the step, both save it and exit 143; torchrun then
    reports its failed children with status 1, as it does for any."""
    run = _start(tmp_path, "torchrun", ["--checkpoint-every", str(EVERY)])
    _past(run, tmp_path, 1)
    ranks = _children(run.pid)
    assert len(ranks) == 2, ranks
    _check_stop(tmp_path, run, ranks[1], signal.SIGTERM, 1)


# ---- in this process -------------------------------------------------------------------------------------


def test_stopped_is_an_interrupt_with_the_shells_status():
    e = stop.Stopped(signal.SIGTERM)
    assert isinstance(e, KeyboardInterrupt) and (e.status, stop.status(e), e.signum) == (143, 143, 15)
    assert stop.status(KeyboardInterrupt()) == stop.status(stop.Stopped(signal.SIGINT)) == 130
    assert [stop.signum_of(c) for c in (130, 143, -2, -15, -9, 0, 1, 3, None)] == [2, 15, 2, 15] + [None] * 5


def test_a_signal_in_a_loop_waits_for_the_steps_end_and_a_second_does_not():
    before = {s: signal.getsignal(s) for s in stop.SIGNALS}
    with pytest.raises(stop.Stopped) as first, stop.deferred() as request:
        os.kill(os.getpid(), signal.SIGTERM)  # before the first step: at once (a compile is cut short)
        time.sleep(1)
    assert first.value.signum == signal.SIGTERM
    with pytest.raises(stop.Stopped) as second, stop.deferred() as request:
        request.armed = True
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.2)
        assert stop.asked() == signal.SIGINT  # recorded, nothing raised: the loop ends its step
        os.kill(os.getpid(), signal.SIGTERM)  # a second signal: at once
        time.sleep(1)
    assert second.value.signum == signal.SIGTERM
    assert {s: signal.getsignal(s) for s in stop.SIGNALS} == before


def test_a_command_answers_sigterm_with_its_line_and_143(capsys):
    before = {s: signal.getsignal(s) for s in stop.SIGNALS}
    progress.reset()

    def main():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
        return 0

    assert guarded("jaxdp")(main)() == 143
    assert capsys.readouterr().err == "jaxdp: interrupted at step 0; nothing written\n"
    assert signal.getsignal(signal.SIGTERM) == before[signal.SIGTERM]
    signal.signal(signal.SIGINT, before[signal.SIGINT])  # the guard left Ctrl-C at its default for the exit
