"""Running torch_ref: the CLI end to end (same flags as jaxdp, a valid trace, the summary line),
torchrun (one host, and hsdp on two hosts), and a failing rank that ends the run promptly with that rank's error."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from jaxdp.core.traces import trace
from jaxdp.harness import torch_cli as cli
from jaxdp.harness.torch_run import run
from tests import REPO
from tests.torch_faults import InjectedFailure, with_fault
from tests.torch_helpers import BASE, as_trace, single
from torch_ref.launch import RankError

FLAGS = ["--steps", "2", "--batch-size", "24", "--hidden", "16,16", "--dtype", "float64", "--seed", "3",
         "--lr", "0.05", "--weight-decay", "0.01", "--optimizer", "momentum", "--clip-norm", "0.5"]
CFG = BASE.replace(steps=2, batch_size=24, optimizer="momentum", clip_norm=0.5)


def _env(**extra):
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""), **extra)
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):  # a clean launch, not a torchrun rank
        env.pop(name, None)
    return env


def test_cli_trains_two_ranks_and_writes_a_trace(tmp_path, capsys):
    """`python -m torch_ref train`'s main (torch_ref/__main__.py runs it), in this process: its ranks come from this
    process's fork server, not a fresh launcher's (a fresh `python -m torch_ref train` runs below: torchrun's ranks,
    the killed-rank test's launcher, and tests/cli/)."""
    path = tmp_path / "zero2.npz"
    assert cli.main(["train", "--strategy", "zero2", "--devices", "2", *FLAGS, "--trace", str(path)]) == 0
    out = capsys.readouterr()
    assert out.out.startswith("zero2 on 2 cpu rank(s) (torch), mlp/synthetic, float64: 2 steps, loss "), out.err
    got = trace.load(path)
    assert got.meta["framework"] == "torch" and got.meta["devices"] == 2
    assert max(trace.diff(got, as_trace(single(CFG)))["worst"].values()) < 1e-12


def test_torchrun_runs_the_same_entry_point(tmp_path):
    path = tmp_path / "fsdp.npz"
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                          "-m", "torch_ref", "train", "--strategy", "fsdp", *FLAGS, "--trace", str(path)],
                         capture_output=True, text=True, timeout=240, cwd=REPO,
                         env=_env(OMP_NUM_THREADS="1", TMPDIR=str(tmp_path)))  # torchrun's own folders: the test's
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.count("zero3 on 2 cpu rank(s)") == 1  # rank 0 alone prints and writes
    assert max(trace.diff(trace.load(path), as_trace(single(CFG)))["worst"].values()) < 1e-12


def test_torchrun_on_two_hosts_gives_each_host_one_shard_group(tmp_path):
    """hsdp 2 x 2 on two torchrun hosts (nodes) of two ranks: row r of the (replicate, shard) mesh is host r's
    ranks (FSDP2's gathers stay in a host), and the trace is single's. Every host's agent under a timeout."""
    from torch_ref.launch import free_port

    port, path = free_port(), tmp_path / "hsdp.npz"
    argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "2",
            "--master-addr", "127.0.0.1", "--master-port", str(port)]
    flags = ["-m", "torch_ref", "train", "--strategy", "hsdp", "--replicas", "2", "--devices", "4", *FLAGS,
             "--trace", str(path)]
    hosts = [subprocess.Popen([*argv, "--node-rank", str(h), *flags], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, cwd=REPO,
                              env=_env(OMP_NUM_THREADS="1", TMPDIR=str(tmp_path)))
             for h in (0, 1)]
    try:
        outs = [h.communicate(timeout=240) for h in hosts]
    finally:
        for h in hosts:
            if h.poll() is None:
                h.kill()
                h.wait()
    assert [h.returncode for h in hosts] == [0, 0], outs[0][1][-3000:] + outs[1][1][-3000:]
    got = trace.load(path)
    assert got.meta["hsdp_grid"] == [[[0, 0], [1, 0]], [[2, 1], [3, 1]]]  # [rank, host]
    assert max(trace.diff(got, as_trace(single(CFG)))["worst"].values()) < 1e-12


def test_a_failing_rank_fails_the_run_fast_with_its_error(monkeypatch):
    from torch_ref import train

    monkeypatch.setattr(train, "train_rank", train.train_rank)  # put back after the test
    with_fault("fail", "1:2")  # rank 1 raises at step 2; rank 0 is then stuck in a collective
    t0 = time.monotonic()
    with pytest.raises(RankError) as info:
        run(BASE.replace(strategy="ddp", devices=2), timeout_s=120, pg_timeout_s=60)
    assert info.value.rank == 1 and isinstance(info.value.cause, InjectedFailure)
    assert "injected failure on rank 1 at step 2" in str(info.value)
    assert time.monotonic() - t0 < 30  # the launcher stops the others; no waiting on the 60 s timeout


def test_cli_reports_a_failing_rank_and_exits_non_zero(monkeypatch, capsys):
    from torch_ref import train

    monkeypatch.setattr(train, "train_rank", train.train_rank)  # put back after the test
    with_fault("fail", "0:1")
    assert cli.main(["train", "--strategy", "ddp-ring", "--devices", "2", *FLAGS]) == 3  # a crashed rank: a failed run
    err = capsys.readouterr().err
    assert "rank 0 failed: InjectedFailure: injected failure on rank 0 at step 1" in err


@pytest.mark.parametrize("argv,message", [
    (["--strategy", "ddp-pmap"], "strategy 'ddp-pmap' exists only in jaxdp; torch_ref has: single, dp, ddp, ddp-naive"),
    (["--devices", "4", "--accum", "3", "--batch-size", "50"], "valid sizes near it: 48, 60"),
])
def test_config_errors_are_one_line(argv, message, capsys):
    try:
        code = cli.main(["train", *argv])
    except SystemExit as e:  # refused while parsing the flags
        code = e.code
    assert code == 2
    assert message in capsys.readouterr().err


def test_fsdp_is_an_alias_of_zero3():
    from jaxdp.core.run.config import RunConfig

    assert RunConfig(strategy="fsdp").validate("torch").strategy == "zero3"


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in open(f"/proc/{pid}/task/{pid}/children").read().split()]
    except OSError:
        return []


def _rank_pids(launcher_pid: int) -> list[int]:
    """The ranks: the children of the launcher's fork server (not multiprocessing's resource tracker)."""
    pids = []
    for server in _children(launcher_pid):
        try:
            cmd = open(f"/proc/{server}/cmdline", "rb").read()
        except OSError:
            continue
        if b"forkserver" in cmd:
            pids += _children(server)
    return sorted(pids)


def test_ranks_start_with_what_every_rank_imports_already_imported():
    """The fork server imports once what each rank would import: torch._dynamo (torch.optim's first step imports
    it: seen in a launcher without transformers, which imports it too). Needs no transformers (the `hf` extra):
    the launcher here has not imported it, so neither has its fork server."""
    code = ("import sys; from torch_ref.launch import launch; from torch_ref import fork_context; "
            "from tests.torch_helpers import loaded; print('transformers' in sys.modules, fork_context.preload(), "
            "launch(loaded, 2, ['torch._dynamo', 'torch_ref.train'], timeout_s=120, pg_timeout_s=60)[0])")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180, cwd=REPO,
                          env=_env())
    assert proc.stdout.strip() == ("False ['torch_ref.rank_server'] {'torch._dynamo': True, 'torch_ref.train': True}"
                                   ), proc.stderr[-2000:]


def test_the_fork_server_imports_transformers_when_the_launcher_has():
    """`fork_context.preload`: transformers when the launcher has imported it (a launcher that built a
    transformers model starts ranks that build it); not its model modules (see preload)."""
    pytest.importorskip("transformers")
    import transformers  # noqa: F401
    from transformers.models.gpt2 import modeling_gpt2  # noqa: F401

    from torch_ref import fork_context

    assert fork_context.preload() == ["torch_ref.rank_server", "transformers"]


def test_a_killed_rank_stops_the_run_quickly():
    """SIGKILL one rank mid-training: the launcher must notice, stop the other and exit non-zero
    within a bounded time, naming the dead rank (never a hang in the survivor's collective)."""
    import signal

    argv = [sys.executable, "-m", "torch_ref", "train", "--strategy", "ddp", "--devices", "2", "--steps", "1000000",
            "--batch-size", "24", "--hidden", "16,16", "--pg-timeout", "120", "--timeout", "300"]
    launcher = subprocess.Popen(
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=REPO, env=_env()
    )
    try:
        deadline = time.monotonic() + 120
        while len(_rank_pids(launcher.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        ranks = _rank_pids(launcher.pid)
        assert len(ranks) == 2
        time.sleep(3)  # let it train (the outcome does not depend on when the kill lands)
        killed_at = time.monotonic()
        os.kill(ranks[1], signal.SIGKILL)
        code = launcher.wait(timeout=90)
        err = launcher.stderr.read()
        assert code != 0 and "rank 1 failed: killed by signal 9 (SIGKILL)" in err, err[-2000:]  # the cause, named
        assert time.monotonic() - killed_at < 60
        for pid in ranks:
            assert not os.path.exists(f"/proc/{pid}") or "Z" in open(f"/proc/{pid}/stat").read().split()[2]
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
