"""`jaxdp train`: every flag checked (the run, its paths, its processes), then one strategy after another,
in this process, in --processes local processes, or as one process of a cluster."""
from __future__ import annotations

import os
import sys

from ..core import (
    argv,
    ckpt_folder,
    config,
    disk_full,
    heartbeat,
    hsdp_hosts,
    last_words,
    lifeline,
    paths,
    ports,
    progress,
    stop,
)
from ..core.errors import EXIT_FAILED, ConfigError, RunFailed, exit_status
from ..core.registry import strategies as registry


def outputs(pattern: str | None, names, flag: str = "--trace", example: str = "runs/{strategy}.npz") -> dict:
    """strategy -> its output path (None: not asked for); several strategies need {strategy} in `flag`."""
    if pattern is None:
        return {n: None for n in names}
    if pattern == "-" and flag == "--json" and len(names) > 1:
        raise ConfigError(f"--json - writes one document to stdout; several strategies write several: give one "
                          f"--strategy, or a path with {{strategy}} in it, e.g. --json {example}")
    if len(names) > 1 and "{strategy}" not in pattern:
        raise ConfigError(f"several strategies write several files: put {{strategy}} in {flag}, e.g. {example}")
    try:
        out = {n: pattern.format(strategy=n) for n in names}
    except (KeyError, IndexError, ValueError):
        raise ConfigError(f"{flag} {pattern}: only {{strategy}} may stand in braces; e.g. {example}") from None
    for path in out.values():
        paths.output_file(path, flag)
    return out


def check_checkpoints(cfgs, framework: str = "jax") -> None:
    """--checkpoint-dir: a folder (or one to create) this run may use (ckpt_folder.py: no other run in it,
    nothing foreign, an earlier run's checkpoints only with --resume or --overwrite-checkpoints); --resume:
    one that exists; one strategy per folder."""
    cfg = cfgs[0]
    if not cfg.checkpoint_dir:
        return
    if len(cfgs) > 1:
        raise ConfigError("--checkpoint-dir takes one strategy at a time (several would share the folder): "
                          "give one --strategy")
    paths.output_dir(cfg.checkpoint_dir, "--checkpoint-dir")
    if cfg.resume and not os.path.isdir(cfg.checkpoint_dir):
        raise ConfigError(f"--resume: no checkpoint directory {cfg.checkpoint_dir}; run once with --checkpoint-dir "
                          f"{cfg.checkpoint_dir} --checkpoint-every K first")
    ckpt_folder.precheck(cfg.checkpoint_dir, framework, resume=cfg.resume, overwrite=cfg.overwrite_checkpoints)


def check_processes(args) -> None:
    """--processes, --timeout and the cluster flags, before any process starts."""
    typed = argv.given(args)
    if args.processes < 1:
        raise ConfigError(f"--processes {args.processes}: must be >= 1; e.g. --processes 2")
    for name in ("timeout", "heartbeat", "startup_timeout"):
        if name in typed and args.processes == 1:
            flag = "--" + name.replace("_", "-")
            raise ConfigError(f"{flag} is read only with --processes P > 1 (a local multi-process run): drop {flag}")
    argv.check_seconds(args, ("timeout", "heartbeat", "startup_timeout"))
    if args.devices % args.processes:
        fits = ", ".join(str(p) for p in range(1, args.devices + 1) if args.devices % p == 0)
        raise ConfigError(
            f"--devices {args.devices} does not divide over --processes {args.processes} (each process holds the "
            f"same number of devices); use --processes {fits}, or --devices "
            f"{args.processes * (args.devices // args.processes + 1)}")
    cluster = [args.coordinator, args.num_processes, args.process_id]
    if args.processes > 1 and any(c is not None for c in cluster):
        raise ConfigError("--processes starts local processes; on a cluster give --coordinator, --num-processes "
                          "and --process-id to each process instead")
    if any(c is not None for c in cluster):
        _check_cluster(args)


def _check_cluster(args) -> None:
    if None in (args.coordinator, args.num_processes, args.process_id):
        raise ConfigError("a cluster run needs all three of --coordinator, --num-processes and --process-id")
    host, _, port = args.coordinator.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"--coordinator {args.coordinator}: give HOST:PORT, e.g. --coordinator 10.0.0.1:1234")
    if args.num_processes < 1:
        raise ConfigError(f"--num-processes {args.num_processes}: must be >= 1")
    if not 0 <= args.process_id < args.num_processes:
        raise ConfigError(f"--process-id {args.process_id}: must be 0 to {args.num_processes - 1} "
                          f"(--num-processes {args.num_processes})")
    if args.devices % args.num_processes:
        raise ConfigError(f"--devices {args.devices} does not divide over --num-processes {args.num_processes}")
    if args.process_id == 0:  # process 0 hosts the coordinator: its port must be free, before any work
        ports.check_free(args.coordinator)


def train(args) -> int:
    cfgs = argv.configs(args)
    trace_paths = outputs(args.trace, [c.strategy for c in cfgs])
    check_checkpoints(cfgs)
    check_processes(args)
    from .. import devices  # JAX: after the checks that need none (a refusal in about a second)

    for cfg in cfgs:
        if registry.entry(cfg.strategy).grid:  # hsdp: the hosts hold whole groups
            hsdp_hosts.check_hosts(cfg.devices, cfg.replicas, args.num_processes or args.processes, cfg.hsdp_hosts)
        note = hsdp_hosts.one_group(cfg)
        if note and args.process_id in (None, 0) and heartbeat.ENV_FILE not in os.environ:  # not a launched child
            print(f"jaxdp: note: {note}", file=sys.stderr, flush=True)
    if args.processes > 1:
        from .. import launch

        shown = ["--progress"] if args.progress is None and sys.stderr.isatty() else []  # their stderr is a pipe
        return launch.launch(_argv_without_processes() + shown, args.processes, args.timeout, args.heartbeat,
                             args.startup_timeout)
    distributed = devices.Distributed.from_env()
    if args.coordinator:
        distributed = devices.Distributed(args.coordinator, args.num_processes, args.process_id)
    return _run(cfgs, trace_paths, args.progress, distributed)


def _run(cfgs, trace_paths, progress, distributed) -> int:
    from .. import train as train_mod

    try:
        for cfg in cfgs:
            path = trace_paths[cfg.strategy]
            result = train_mod.run(cfg, trace_path=path, progress=progress, distributed=distributed)
            if distributed is None or distributed.process_id == 0:
                print(train_mod.summary(result) + (f"; trace: {path}" if path else ""), flush=True)
    except BaseException as e:
        if distributed is None:
            raise
        # Exit now: jax.distributed's exit-time barrier would otherwise wait for the other
        # processes, which wait for this one. The launcher (or cluster) sees the status at once.
        _report(e, distributed.process_id)
        sys.stderr.flush()
        os._exit(_status(e))
    return 0


def _last_words(e: BaseException, process: int) -> None:
    """Process `process`'s one line for `e` (and a crash's traceback): to its launcher (`last_words`), which
    prints the first cause's alone, or printed here (a cluster process, started by hand)."""
    import traceback

    full = disk_full.find(e)
    named = isinstance(e, (config.ConfigError, RunFailed)) or full is not None  # those are their one line
    what = disk_full.line(full) if full is not None and not isinstance(e, RunFailed) else f"{type(e).__name__}: {e}"
    line, tb = f"jaxdp: error: process {process}: {what}", "" if named else traceback.format_exc()
    if not last_words.leave(line, _status(e), tb):
        print(line, file=sys.stderr)
        sys.stderr.write(tb)
    sys.stderr.flush()


def answered():
    """The errors a `jaxdp` command answers in one line (errors.exit_status: 2 bad input, 3 a failed run or
    file); any other is a crash."""
    from ..core.record import CheckpointError  # jaxdp.checkpoint's, without importing orbax
    from ..core.trace import TraceError

    devices = sys.modules.get("jaxdp.devices")  # not imported (a refusal before any device): nothing it raised
    return ConfigError, getattr(devices, "DeviceError", ConfigError), TraceError, CheckpointError, RunFailed, OSError


def _report(e: BaseException, process_id: int) -> None:
    """A process's words for `e` on stderr: none for a stop under our launcher (it prints the run's one line),
    the stop's line on a cluster, one error line (and the traceback of a crash) otherwise."""
    if isinstance(e, KeyboardInterrupt):
        if lifeline.from_env() is None:
            print(f"{progress.line(f'jaxdp: process {process_id}')} ({stop.status(e)})", file=sys.stderr)
        return
    _last_words(e, process_id)


def _status(e: BaseException) -> int:
    """A process's exit status for `e`: an answered error's, 130 for Ctrl-C (143 for SIGTERM: jaxdp.core.stop),
    3 for a crash (a full disk in a library's error: 3)."""
    if isinstance(e, KeyboardInterrupt):
        return stop.status(e)
    return exit_status(e) if isinstance(e, answered()) else EXIT_FAILED


LAUNCHER_FLAGS = ("--processes", "--timeout", "--heartbeat", "--startup-timeout")  # the launcher's, not its children's


def _argv_without_processes() -> list[str]:
    out, skip = [], False
    for a in sys.argv[1:]:
        if skip:
            skip = False
            continue
        if a in LAUNCHER_FLAGS:
            skip = True
            continue
        if a.startswith(tuple(f + "=" for f in LAUNCHER_FLAGS)):
            continue
        out.append(a)
    return out
