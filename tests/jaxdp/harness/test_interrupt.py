"""Ctrl-C (docs/TRACE.md, "Interrupting a run"): a real SIGINT sent to a real command's process group, as
a terminal sends it, once the command has done a step (read from its JAXDP_PROGRESS_FILE report).
Each must answer with one line on stderr and status 130, leave no --out/--trace file or folder and no
temporary file, and leave no process of its group alive (ranks and `--processes` children included).
The writers' all-or-nothing (`jaxdp.core.files.atomic`) and the commands that write reports (`compare`,
`bench`) are checked in this process, where an interrupt is raised at the worst moment."""
from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

from jaxdp.core.files import atomic
from jaxdp.core.process import progress
from jaxdp.core.traces import trace
from jaxdp.core.traces.trace import TraceError, check_writable
from tests import REPO

ROOT = REPO
TINY = ["--model", "mlp", "--hidden", "8", "--batch-size", "8", "--steps", "100000"]
LINE = re.compile(r"(jaxdp|torch_ref): interrupted at step (\d+); (nothing written|kept .+)")
STARTED = re.compile(r"jaxdp: started process \d \(pid \d+\)")  # the launcher's lines at start, not the answer
RUN_TIMEOUT_S = 120


def _group(pgid: int) -> list[int]:
    """Live (not zombie) processes of process group `pgid`, read from /proc."""
    alive = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            alive.append(int(pid))
    return alive


def _as_from_a_terminal() -> None:
    """The command starts as a shell starts it in a terminal: SIGINT at its default and not blocked, whatever
    this test process inherited or was left with by an earlier test."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])


def _signals(pid: int) -> str:
    """The ignored and blocked signal masks of process `pid` (from /proc), for a failure's message."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return " ".join(line.strip() for line in f if line.startswith(("SigIgn", "SigBlk", "SigCgt", "State")))
    except OSError:
        return "(gone)"


def interrupt(tmp_path, argv: list[str], at_step: int = 1) -> tuple[int, list[str], str]:
    """Start `python -m <argv>` in its own process group with its files under tmp_path/run, Ctrl-C it after
    step `at_step`; returns (status, stderr's lines, what is left in run/)."""
    run = tmp_path / "run"
    run.mkdir()
    report, err_path = tmp_path / "progress.json", tmp_path / "stderr.txt"
    path = os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, progress.ENV: str(report), "PYTHONPATH": path}
    with open(err_path, "w") as err:
        p = subprocess.Popen([sys.executable, "-m", *argv], cwd=run, env=env, stdout=subprocess.DEVNULL, stderr=err,
                             start_new_session=True, preexec_fn=_as_from_a_terminal)
    try:
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while progress.read(report)[0] < at_step:
            assert p.poll() is None, f"exited ({p.returncode}) before step {at_step}: {err_path.read_text()[-2000:]}"
            assert time.monotonic() < deadline, f"no step {at_step} within {RUN_TIMEOUT_S}s"
            time.sleep(0.05)
        os.killpg(p.pid, signal.SIGINT)
        try:
            status = p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            here = f"SIGINT {signal.getsignal(signal.SIGINT)}, blocked {signal.pthread_sigmask(signal.SIG_BLOCK, [])}"
            raise AssertionError(f"no answer to SIGINT within 60 s; {_signals(p.pid)}; this process: {here}; "
                                 f"stderr: {err_path.read_text()[-2000:]}") from None
        for _ in range(50):  # the launcher reaped its children before exiting; their own helpers need a moment
            if not _group(p.pid):
                break
            time.sleep(0.1)
        assert not _group(p.pid), f"processes left running: {_group(p.pid)}"
    finally:
        if p.poll() is None or _group(p.pid):
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    left = sorted(str(q.relative_to(run)) for q in run.rglob("*"))
    return status, err_path.read_text().splitlines(), left


def _answer(lines: list[str], prog: str) -> re.Match:
    lines = [line for line in lines if not STARTED.fullmatch(line)]
    assert len(lines) == 1, lines
    m = LINE.fullmatch(lines[0])
    assert m and m[1] == prog, lines[0]
    return m


def test_train_one_process_keeps_its_checkpoint(tmp_path):
    status, lines, left = interrupt(tmp_path, ["jaxdp", "train", "--strategy", "ddp", "--devices", "2", *TINY,
                                               "--trace", "out/t.npz", "--checkpoint-dir", "ck",
                                               "--checkpoint-every", "2"], at_step=2)
    m = _answer(lines, "jaxdp")
    assert status == 130 and int(m[2]) >= 2
    kept = re.fullmatch(r"kept checkpoint step (\d+) in ck", m[3])
    assert kept and int(kept[1]) % 2 == 0 and int(kept[1]) <= int(m[2]), m[3]
    assert f"ck/{kept[1]}" in left and not any(p.startswith("out") for p in left), left  # no trace, no out/


def test_train_processes_2(tmp_path):
    status, lines, left = interrupt(tmp_path, ["jaxdp", "train", "--strategy", "ddp", "--devices", "2",
                                               "--processes", "2", "--timeout", "100", *TINY, "--trace", "out/t.npz"])
    m = _answer(lines, "jaxdp")
    assert (status, m[3], left) == (130, "nothing written", []) and int(m[2]) >= 1


def test_torch_ref_train_two_ranks(tmp_path):
    status, lines, left = interrupt(tmp_path, ["torch_ref", "train", "--strategy", "ddp", "--devices", "2", *TINY,
                                               "--timeout", "100", "--trace", "out/t.npz"])
    m = _answer(lines, "torch_ref")
    assert (status, m[3], left) == (130, "nothing written", []) and int(m[2]) >= 1


def test_parity(tmp_path):
    """`single` on one device: the cheapest parity run (7 s of CPU against 10 for ddp on 2)."""
    status, lines, left = interrupt(tmp_path, ["jaxdp", "parity", "--strategies", "single", "--devices", "1", *TINY])
    m = _answer(lines, "jaxdp")
    assert (status, m[3], left) == (130, "nothing written", [])


# ---- in this process: the writers and the commands that write reports --------------------------------


@pytest.fixture
def fresh_progress():
    """progress.NOW from zero, and SIGINT's handler as pytest had it (the guard resets it to the default)."""
    handler = signal.getsignal(signal.SIGINT)
    progress.reset()
    yield
    progress.reset()
    signal.signal(signal.SIGINT, handler)


def test_a_stopped_writer_leaves_nothing(tmp_path):
    out = tmp_path / "a" / "b"
    with pytest.raises(KeyboardInterrupt), atomic.staged(out) as stage:
        atomic.write_text(os.path.join(stage, "one.json"), "{}")
        raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt), atomic.writing(out / "c" / "two.txt", "w") as f:
        f.write("half")
        raise KeyboardInterrupt
    assert list(tmp_path.iterdir()) == []  # no stage, no out, not even its parents
    with atomic.staged(out) as stage:
        atomic.write_json(os.path.join(stage, "one.json"), {"a": 1})
    assert os.listdir(out) == ["one.json"] and json.loads((out / "one.json").read_text()) == {"a": 1}


def test_check_writable_makes_no_folder(tmp_path):
    check_writable(tmp_path / "x" / "y" / "t.npz")
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "file").write_text("")
    with pytest.raises(TraceError, match="--trace .*is a file, not a folder"):
        check_writable(tmp_path / "file" / "t.npz")


def test_compare_stopped_while_writing_its_report(tmp_path, monkeypatch, capsys, fresh_progress):
    """Ctrl-C after two figures of the report: no report, no --out folder; the one line, status 130."""
    from jaxdp.harness import cli
    from jaxdp.harness.report import plots, runner

    def draw_two(summary, folder):
        for name in ("loss.png", "comm.png"):
            atomic.write_bytes(os.path.join(folder, name), b"png")
        raise KeyboardInterrupt

    # a summary whose "Which strategy" is already derived (the report reads it, as it reads summary.json's)
    done = {"strategies": [], "recommendation": {"situations": []}}
    monkeypatch.setattr(runner, "compare", lambda *a, **k: progress.step_done(3) or done)
    monkeypatch.setattr(plots, "draw_all", draw_two)
    out = tmp_path / "reports" / "compare"
    assert cli.main(["compare", "--strategies", "ddp", "--devices", "2", "--out", str(out)]) == 130
    assert capsys.readouterr().err.splitlines()[-1] == "jaxdp: interrupted at step 3; nothing written"
    assert list(tmp_path.iterdir()) == []


def test_bench_stopped_before_writing(tmp_path, monkeypatch, capsys, fresh_progress):
    from jaxdp.harness import bench, cli

    def stopped(**kwargs):
        progress.kept(tmp_path / "earlier.npz", "trace earlier.npz")
        raise KeyboardInterrupt

    monkeypatch.setattr(bench, "run", stopped)
    assert cli.main(["bench", "--quick", "--out", str(tmp_path / "bench")]) == 130
    assert capsys.readouterr().err == "jaxdp: interrupted at step 0; kept trace earlier.npz\n"
    assert list(tmp_path.iterdir()) == []


# ---- Ctrl-C deferred, never ignored; a closed output pipe ends quietly ---------------------------------

REAPING = """
import sys, time
import torch_ref.launch as launch
from jaxdp.harness.interrupt import guarded
stop = launch._stop
def slow_stop(procs, wait_s=5.0):
    if wait_s:  # the reaping after a finished run (up to 5 s): where Ctrl-C used to be ignored
        print("reaping", flush=True)
        time.sleep(1)
    stop(procs, wait_s)
launch._stop = slow_stop
sys.exit(guarded("torch_ref")(lambda: launch.launch(max, 1) and 0)())
"""


def test_ctrl_c_while_the_ranks_are_reaped_is_answered_130(tmp_path):
    """A real SIGINT to the process group once the one rank has finished and is being reaped: the run ends
    with 130 and its one line (it ended 0 when SIGINT was ignored there)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])}
    p = subprocess.Popen([sys.executable, "-c", REAPING], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True, preexec_fn=_as_from_a_terminal)
    try:
        assert p.stdout.readline() == "reaping\n", p.stderr.read()[-2000:]
        os.killpg(p.pid, signal.SIGINT)
        status = p.wait(timeout=30)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    err = p.stderr.read().splitlines()
    assert (status, err) == (130, ["torch_ref: interrupted at step 0; nothing written"]), (status, err)


def test_children_leave_ctrl_c_to_this_process_which_keeps_it(fresh_progress):
    """Started inside `sigint_left_to_this_process`, a child has SIGINT blocked; a SIGINT to this process
    meanwhile, with another thread running (as JAX's and torch's are), is raised when the block ends, not lost."""
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as Python starts from a terminal
    busy = threading.Event()
    threading.Thread(target=busy.wait, args=(5,), daemon=True).start()
    code = "import signal; print(sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])))"
    with pytest.raises(KeyboardInterrupt), progress.sigint_left_to_this_process():
        child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        os.kill(os.getpid(), signal.SIGINT)
    busy.set()
    assert int(signal.SIGINT) in json.loads(child.communicate(timeout=30)[0])
    with progress.sigint_deferred():
        pass  # no Ctrl-C: nothing raised


@contextlib.contextmanager
def closed_stdout():
    """sys.stdout a pipe whose reader has gone, as after `| head -2` exits (set in the test's body: pytest's
    capture sets sys.stdout again when the test starts)."""
    read, write = os.pipe()
    os.close(read)
    out, stdout = os.fdopen(write, "w"), sys.stdout
    sys.stdout = out
    try:
        yield out
    finally:
        sys.stdout = stdout
        with contextlib.suppress(OSError):
            out.close()


def test_a_closed_pipe_ends_the_command_quietly(tmp_path, capsys):
    """`jaxdp diff A B | head -2` and `python -m torch_ref train -h | head -1`: status 141 (128 + SIGPIPE, as a
    shell reports `cat` ended so), nothing on stderr; stdout left on /dev/null for the interpreter's exit."""
    from jaxdp.harness import cli, torch_cli
    from tests.jaxdp.core.traces.test_data_and_trace import tiny_trace

    t = tiny_trace()
    paths = [str(tmp_path / "a.npz"), str(tmp_path / "b.npz")]
    for path in paths:
        trace.save(path, t.meta, t.arrays)
    for main, argv_ in ((cli.main, ["diff", *paths, "--no-config-check"]), (torch_cli.main, ["train", "-h"])):
        with closed_stdout() as out:
            try:
                status = main(argv_)
            except SystemExit as e:  # -h: argparse exits (0 when it dropped the failed write itself)
                status = e.code
            assert status in ((0, 141) if "-h" in argv_ else (141,)), argv_
            if status == 141:  # stdout now /dev/null: the interpreter's last flush prints no 'Exception ignored'
                out.write("x" * 100000)
                out.flush()
    assert capsys.readouterr().err == ""
