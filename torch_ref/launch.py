"""Start N ranks on this machine with torch.distributed, or join a world that torchrun started.

`launch(fn, n, *args)` starts N processes (torch.multiprocessing's 'forkserver': a server process imports torch and
torch_ref once, `torch_ref.rank_server`, and forks each rank from it, with this process's environment), gives them a
free port on 127.0.0.1, initialises the process group in each (gloo on CPU, nccl on GPU, with a timeout on every
collective), runs `fn(rank, n, *args)` and returns every rank's return value. A rank that raises is reported to the
parent, which waits a moment for the other ranks' errors, terminates every rank still running and raises `RankError`
carrying the *first* error in time (the originating one: the others are usually their peers' broken connections).
The parent also gives up after `timeout` seconds. So a failure ends the run promptly, never a hang. Ctrl-C is the
parent's alone (the ranks start with SIGINT blocked); SIGINT or SIGTERM to it is forwarded to every rank as SIGTERM.
A rank that a signal reaches ends its step, all agree on the step to stop after (torch_ref/train.py), save it and
exit 143 (130: SIGINT); the parent raises `jaxdp.core.process.stop.Stopped`, and kills a rank left after STOP_S.
Under torchrun, `from_env()` reads RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT.
"""
from __future__ import annotations

import datetime
import faulthandler
import os
import pickle
import queue as queue_mod
import signal as signal_mod
import tempfile
import time
import traceback

import torch
import torch.distributed as dist

from jaxdp.core.errors import ConfigError
from jaxdp.core.process import heartbeat, lifeline, ports, progress, stop
from jaxdp.core.process.ports import free_port  # noqa: F401  (torchrun-style tests pick a port with it)

from . import fork_context

GRACE_S = 2.0  # after the first error: how long to collect the others' before terminating them
STOP_S = 7.0  # after a signal: how long the ranks have to end their step and save it before they are killed


class RankError(RuntimeError):
    """A rank failed; `rank` says which, `cause` is its exception (when it could be pickled), `signal` the
    signal that killed it (a native crash, a kill), if one did."""

    def __init__(self, rank: int, message: str, tb: str = "", cause: BaseException | None = None,
                 signal: int | None = None):
        super().__init__(f"rank {rank} failed: {message}")
        self.rank, self.traceback, self.cause, self.signal = rank, tb, cause, signal


class RankStopped(RankError):
    """A rank that stopped responding (no heartbeat for a whole interval: stopped, frozen) or never started
    (no first heartbeat within the start-up limit); `line` says which (`heartbeat.Watch.stopped`)."""

    def __init__(self, rank: int, line: str):
        super().__init__(rank, "stopped responding")
        self.args = (line,)


def _killed(procs) -> tuple[int, int] | None:
    """(rank, signal) of the first rank a signal killed, or None."""
    return next(((r, -p.exitcode) for r, p in enumerate(procs) if p.exitcode is not None and p.exitcode < 0), None)


def _signal_name(number: int) -> str:
    return signal_mod.Signals(number).name if number in {s.value for s in signal_mod.Signals} else f"signal {number}"


def backend_for(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def check_platform(platform: str, devices: int) -> None:
    """--platform gpu on a machine where torch sees none: one line before any rank starts."""
    if platform == "gpu" and not torch.cuda.is_available():
        raise ConfigError(f"--platform gpu: torch sees no GPU on this machine; use --platform cpu to run {devices} "
                          f"rank(s) on the CPU")


def rank_device(platform: str, local_rank: int) -> torch.device:
    """cuda:<local rank> when a GPU is asked for or (platform 'auto') present; else the CPU."""
    if platform == "gpu" and not torch.cuda.is_available():
        raise RuntimeError("--platform gpu: torch sees no GPU on this machine; use --platform cpu")
    if platform != "cpu" and torch.cuda.is_available():
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    return torch.device("cpu")


def pin_float32(device: torch.device) -> None:
    """On a GPU, float32 matrix products and convolutions without TF32 (jaxdp pins its side to 'highest' too:
    `jaxdp.devices.pin_float32_matmuls`), so float32 parity holds; cuDNN's convolutions default to TF32."""
    if device.type == "cuda":
        torch.set_float32_matmul_precision("highest")
        torch.backends.cudnn.allow_tf32 = False


def init_process_group(device: torch.device, rank: int, world: int, timeout_s: float, store=None) -> None:
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend_for(device), rank=rank, world_size=world, store=store,
                            timeout=datetime.timedelta(seconds=timeout_s))


def from_env() -> tuple[int, int, int] | None:
    """(rank, world size, local rank) when started by torchrun (or any env:// launcher), else None."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return None
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    return rank, world, int(os.environ.get("LOCAL_RANK", rank))


def ranks_per_host(world: int) -> int:
    """Ranks on each host (node): torchrun's LOCAL_WORLD_SIZE; every rank on one host when it is not set
    (this module's spawned world). Ranks are host-major: host h holds ranks [h L, (h+1) L)."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", world))


def hsdp_grid(model, world: int) -> list[list[list[int]]]:
    """hsdp's (replicate, shard) mesh as [row r (a shard group)][column s] = [rank, its host], read from a
    sharded parameter (jaxdp's trace key `hsdp_grid`: [device id, process])."""
    mesh = next(p.device_mesh for p in model.parameters() if hasattr(p, "device_mesh"))
    per_host = ranks_per_host(world)
    return [[[int(k), int(k) // per_host] for k in row] for row in mesh.mesh.tolist()]


def _entry(rank, world, port, platform, pg_timeout_s, results, report, beat, env, fn, args):
    """Runs in each rank (Ctrl-C blocked but in its loop: jaxdp.core.process.stop). It takes the launcher's
    environment `env`
    (the fork server's is the one it started with), dies with the launcher (`jaxdp.core.process.lifeline`), beats
    (`beat`: the launcher's pid, this rank's heartbeat file and interval), joins the launcher's store on
    127.0.0.1:`port`. Rank 0 reports its progress through the file `report`."""
    signal_mod.pthread_sigmask(signal_mod.SIG_BLOCK, [signal_mod.SIGINT])  # the loop takes it (jaxdp.core.process.stop)
    signal_mod.signal(signal_mod.SIGINT, signal_mod.default_int_handler)
    stop.on_sigterm()
    launcher, beat_path, heartbeat_s = beat
    faulthandler.enable()  # a native crash (SIGSEGV in torch or gloo) prints every thread's Python stack first
    lifeline.bind_to(launcher, through_server=True)
    os.environ.clear()
    os.environ.update(env)
    tempfile.tempdir = None  # read from TMPDIR anew
    heartbeat.start(beat_path, heartbeat_s)
    os.environ.update(MASTER_ADDR=ports.LOOPBACK, MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    if ports.loopback_interface() and "GLOO_SOCKET_IFNAME" not in os.environ:  # a local run: gloo on loopback
        os.environ["GLOO_SOCKET_IFNAME"] = ports.loopback_interface()
    os.environ.pop(progress.ENV, None)
    if rank == 0:
        os.environ[progress.ENV] = report
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    try:
        device = rank_device(platform, rank)
        store = dist.TCPStore(ports.LOOPBACK, port, world, False, datetime.timedelta(seconds=pg_timeout_s))
        init_process_group(device, rank, world, pg_timeout_s, store=store)
        value = fn(rank, world, *args)
        results.put(("ok", rank, value, time.time()))
        dist.destroy_process_group()
    except BaseException as e:  # report, then exit without waiting on peers that may be gone
        for s in stop.SIGNALS:  # the launcher's SIGTERM now must not cut the report short
            signal_mod.signal(s, signal_mod.SIG_IGN)
        if isinstance(e, stop.Stopped):  # a signal's stop, after the step every rank agreed on
            results.put(("stopped", rank, e.signum, time.time()))
        else:
            try:
                cause = pickle.loads(pickle.dumps(e))  # only what the parent can rebuild
            except Exception:
                cause = None
            results.put(("error", rank, (f"{type(e).__name__}: {e}", traceback.format_exc(), cause), time.time()))
        results.close()
        results.join_thread()
        os._exit(stop.status(e) if isinstance(e, stop.Stopped) else 1)


def _store(timeout_s: float) -> tuple[dist.TCPStore, int]:
    """The ranks' rendezvous store, served by this process on a free 127.0.0.1 port (TCPStore alone would
    listen on every interface, and a port chosen then bound by a rank could be taken in between)."""
    sock = ports.listener()
    store = dist.TCPStore(ports.LOOPBACK, sock.getsockname()[1], None, True, datetime.timedelta(seconds=timeout_s),
                          wait_for_workers=False, master_listen_fd=sock.detach())
    return store, store.port


def launch(fn, nprocs: int, *args, platform: str = "auto", timeout_s: float = 3600.0,
           pg_timeout_s: float = 300.0, heartbeat_s: float | None = None, startup_s: float | None = None) -> list:
    """Run `fn(rank, nprocs, *args)` on `nprocs` new processes; return [rank 0's value, ...]. On Ctrl-C
    (which the ranks ignore) the ranks are stopped and reaped, rank 0's progress becomes this process's
    (`jaxdp.core.process.progress`), and KeyboardInterrupt goes on up. RankStopped: a rank silent for `heartbeat_s`
    since its first beat, or without one after `startup_s` (None: the command's --heartbeat and
    --startup-timeout, `heartbeat.limits`)."""
    beats = heartbeat.Watch(nprocs, *heartbeat.limits(heartbeat_s, startup_s))
    ctx = fork_context.context()
    results = ctx.Queue()
    store, port = _store(pg_timeout_s)
    with progress.channel() as report:
        procs = [ctx.Process(target=_entry, args=(r, nprocs, port, platform, pg_timeout_s, results, report,
                                                  (os.getpid(), beats.path(r), beats.interval_s), dict(os.environ),
                                                  fn, args),
                             daemon=True, name=f"torch_ref-rank{r}") for r in range(nprocs)]
        ok = False
        starting = fork_context.start(procs, lambda rank, e: results.put(
            ("error", rank, (f"the rank did not start: {type(e).__name__}: {e}", "", None), time.time())))
        try:
            values = _collect(procs, results, nprocs, timeout_s, beats)
            ok = True
            return values
        except KeyboardInterrupt:
            with progress.sigint_deferred():  # a second Ctrl-C does not cut the stopping short
                _halt(fork_context.started(procs, starting))
                progress.merge(report)
            raise
        finally:
            with progress.sigint_deferred():  # Ctrl-C while the ranks are reaped: answered (130) once they are
                _stop(fork_context.started(procs, starting), wait_s=5.0 if ok else 0.0)
                progress.merge(report)
                beats.close()
                del store


def _collect(procs, results, nprocs: int, timeout_s: float, beats: heartbeat.Watch) -> list:
    """Every rank's value, in rank order; RankError for the first failure in time, RankStopped for a rank
    that stopped beating, TimeoutError."""
    values, errors, stops = {}, [], {}
    deadline = time.monotonic() + timeout_s
    first_error_at = dead_since = None
    while len(values) + len(stops) < nprocs:
        now = time.monotonic()
        if (errors and now - first_error_at > GRACE_S) or (stops and now - first_error_at > STOP_S):
            break
        if now > deadline:
            raise TimeoutError(f"torch_ref: the {nprocs} ranks did not finish within {timeout_s:.0f}s "
                               f"(finished: {sorted(values)})")
        if not errors:
            _raise_stopped(procs, values, beats)
        try:
            kind, rank, payload, t = results.get(timeout=0.1)
        except queue_mod.Empty:
            said = values.keys() | stops.keys()
            silent = [p for r, p in enumerate(procs) if p.exitcode not in (None, 0) and r not in said]
            if silent and not errors:  # died without a word (killed, segfault): allow the pipe to drain
                dead_since = dead_since or now
                if now - dead_since > GRACE_S:
                    _raise_stopped(procs, values, beats, heartbeat.STALE_S)  # the first cause, if one stopped
                    r, code = procs.index(silent[0]), silent[0].exitcode
                    if code < 0:
                        raise RankError(r, f"killed by signal {-code} ({_signal_name(-code)})", signal=-code) from None
                    raise RankError(r, f"process exited with code {code} and no Python error") from None
            continue
        if kind == "ok":
            values[rank] = payload
        elif kind == "stopped":
            stops[rank] = payload
            first_error_at = first_error_at or time.monotonic()
        else:
            errors.append((t, rank, payload))
            first_error_at = first_error_at or time.monotonic()
    if stops and not errors:  # every rank ended the same step (the others are killed if they have not)
        raise stop.Stopped(max(stops.values()))
    if errors:
        _raise_stopped(procs, values, beats, heartbeat.STALE_S)  # a stopped rank: its peers' timeouts follow
        _, rank, (message, tb, cause) = min(errors, key=lambda e: e[0])
        killed = _killed(procs)  # a rank killed by a signal raises nothing; its peers' errors follow from it
        if killed is not None and killed[0] != rank:
            r, number = killed
            raise RankError(r, f"killed by signal {number} ({_signal_name(number)}); then rank {rank}: {message}",
                            tb, cause, signal=number)
        raise RankError(rank, message, tb, cause)
    return [values[r] for r in range(nprocs)]


def _raise_stopped(procs, values, beats: heartbeat.Watch, after_s: float | None = None) -> None:
    """RankStopped for a running rank quiet for `after_s` (default: the heartbeat interval) since its first
    beat, killed first, or (no `after_s`) one not started within the start-up limit."""
    stopped = beats.stopped([r for r, p in enumerate(procs) if p.exitcode is None and r not in values], "rank",
                            after_s)
    if stopped is not None:
        if procs[stopped[0]].pid is not None:
            procs[stopped[0]].kill()  # a stopped process takes no other signal
        raise RankStopped(*stopped)


def _halt(procs) -> None:
    """A stop asked by a signal: SIGTERM to every rank, STOP_S for them to save their step and exit, then `_stop`."""
    for p in procs:
        if p.is_alive():
            p.terminate()
    _stop(procs, wait_s=STOP_S)


def _stop(procs, wait_s: float = 5.0) -> None:
    """Join finished ranks; terminate, then kill, those still running."""
    end = time.monotonic() + wait_s
    for p in procs:
        p.join(timeout=max(0.0, end - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(timeout=2.0)
        if p.is_alive():
            p.kill()
            p.join(timeout=1.0)
