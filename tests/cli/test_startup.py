"""A worker's start-up, in both launchers (`jaxdp train --processes 2`, torch_ref's `launch`): a worker that
starts late (a loaded machine: Python, JAX or torch importing for minutes) is waited for within the start-up
limit (--startup-timeout), whatever --heartbeat is, and one that never starts is named at that limit in one
line, its launcher's processes all gone. The late start is real: a `sitecustomize` (run by every new Python
before its first line) sleeps in the processes whose command line holds SLOW_START_ARG: jaxdp's workers
(`--process-id`), torch_ref's fork server (`forkserver`: every rank waits for its imports)."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from jaxdp.core.process import xla_flags
from tests import REPO

HOOK = ("import os, sys, time\n"
        "if os.environ.get('SLOW_START_ARG', '\\0') in ' '.join(sys.orig_argv):\n"
        "    time.sleep(float(os.environ['SLOW_START_S']))\n")
TRAIN = ["--strategy", "ddp", "--hidden", "8,8", "--devices", "2", "--steps", "1", "--batch-size", "8"]
TORCH = ("import sys; from torch_ref.launch import launch, RankError; from tests.torch_helpers import loaded\n"
         "try:\n    print(launch(loaded, 2, ['torch'], timeout_s=300, pg_timeout_s=60, heartbeat_s=2, "
         "startup_s={startup}))\n"
         "except RankError as e:\n    print(e); sys.exit(3)\n")


def _run(tmp_path, cmd, arg: str, delay_s: float, timeout: float):
    (tmp_path / "sitecustomize.py").write_text(HOOK)
    env = xla_flags.for_child(os.environ) | {"PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO}",
                                             "SLOW_START_ARG": arg, "SLOW_START_S": str(delay_s)}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(name, None)
    t0 = time.monotonic()
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO, env=env)
    return out, time.monotonic() - t0  # captured: a worker left running would hold the pipes (and the time)


@pytest.mark.slow
def test_torch_ranks_started_late_are_waited_for_beyond_the_heartbeat(tmp_path):
    out, _ = _run(tmp_path, [sys.executable, "-c", TORCH.format(startup=120)], "forkserver", 6, 240)
    assert out.returncode == 0 and out.stdout.strip() == "[{'torch': True}, {'torch': True}]", out.stderr[-3000:]


def test_torch_ranks_that_never_start_are_named_at_the_start_up_limit(tmp_path):
    """The fork server is still importing after --startup-timeout (3 s here; it would take 600 s): one line, and
    the server is stopped (before, the launch waited for it for ever: `Process.start` reads the rank's pid)."""
    out, took = _run(tmp_path, [sys.executable, "-c", TORCH.format(startup=3)], "forkserver", 600, 120)
    assert out.returncode == 3, out.stderr[-3000:]
    assert out.stdout.strip() == ("rank 0 did not start within 3 s (no first heartbeat; a loaded machine may need a "
                                  "longer --startup-timeout); stopping the others"), out.stderr[-3000:]
    assert took < 90  # the sleeping server, killed, holds no pipe


def test_jaxdp_processes_that_never_start_are_named_at_the_start_up_limit(tmp_path):
    cmd = [sys.executable, "-m", "jaxdp", "train", *TRAIN, "--processes", "2", "--startup-timeout", "3"]
    out, took = _run(tmp_path, cmd, "--process-id", 600, 120)
    assert out.returncode == 3, out.stderr[-3000:]
    errors = [line for line in out.stderr.splitlines() if "error" in line]
    assert errors == ["jaxdp: error: process 0 did not start within 3 s (no first heartbeat; a loaded machine may "
                      "need a longer --startup-timeout); stopping the others"], out.stderr[-3000:]
    assert took < 90  # both workers, still sleeping, killed


@pytest.mark.slow
def test_jaxdp_processes_started_late_are_waited_for_beyond_the_heartbeat(tmp_path):
    cmd = [sys.executable, "-m", "jaxdp", "train", *TRAIN, "--processes", "2", "--heartbeat", "10",
           "--startup-timeout", "300"]
    out, _ = _run(tmp_path, cmd, "--process-id", 14, 400)
    assert out.returncode == 0 and out.stdout.startswith("ddp on 2 "), out.stderr[-3000:]


@pytest.mark.parametrize("command", ["compare", "parity", "bench"])
def test_commands_that_start_torch_ranks_take_the_limits_of_train(command, monkeypatch, capsys):
    """--heartbeat and --startup-timeout (one definition, `jaxdp.core.run.argv.add_heartbeat`) reach the launches of
    compare's, parity's and bench's torch ranks (`heartbeat.limits`); a bad value is one line, status 2."""
    from jaxdp.core.process import heartbeat
    from jaxdp.harness import cli, cli_runs

    seen = []
    monkeypatch.setattr(cli_runs, command, lambda args: seen.append(heartbeat.limits()) or 0)
    assert cli.main([command, "--heartbeat", "5", "--startup-timeout", "700"]) == 0
    assert seen == [(5.0, 700.0)]
    assert heartbeat.limits() == (heartbeat.DEFAULT_S, heartbeat.STARTUP_S)  # put back: later launches' own
    assert cli.main([command, "--startup-timeout", "0"]) == 2 and len(seen) == 1
    assert capsys.readouterr().err == ("jaxdp: error: --startup-timeout 0.0: must be a finite number of seconds > 0; "
                                       "e.g. --startup-timeout 60\n")
