"""The measurements: timed runs of both frameworks (items 1-3, 6's first step) and the compiled JAX
steps on up to 16 simulated devices, in a child process (items 4-6)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

from ... import devices, train
from ...analysis import accounting
from ...core.run import data
from ...core.run.config import RunConfig
from ...core.run.timing import timing
from .plan import Plan, comm_runs, plan, time_runs
from .tables import jsonable, key

# ---- timed runs (items 1, 2, 3, 6) --------------------------------------------------------------


def _torch_rank(rank: int, n: int, jobs: list) -> list:
    """Runs in each spawned torch rank: every job of this world, no trace recording."""
    from torch_ref.train import train_rank

    out = []
    for cfg, init in jobs:
        res = train_rank(rank, n, cfg, init, False)
        out.append(None if res is None else {"step_times": list(res.step_times), "losses": list(res.losses)})
    return out


def timed_as(strategies) -> dict:
    """{-jit strategy: its torch twin} for the -jit strategies among `strategies` whose twin is there too:
    torch_ref runs a -jit name as its twin (`torch_ref.strategies.TWINS`), the same torch program."""
    from torch_ref.strategies import TWINS

    asked = set(strategies)
    return {name: TWINS[name] for name in sorted(asked) if TWINS.get(name) in asked}


def run_torch(cfgs: list, n: int) -> dict:
    """{strategy: {"step_times", "losses"}} for configs of one device count: a spawned gloo world of
    n ranks runs them all (one spawn per world); n = 1 runs in this process. A -jit strategy whose torch
    twin (`torch_ref.strategies.TWINS`: the same torch program) is also asked for is not run again: it
    gets the twin's figures, marked `"timed_as": twin`."""
    import torch

    from torch_ref import launch
    from torch_ref.train import train_rank

    from ... import models

    twin_of = timed_as(c.strategy for c in cfgs)
    jobs = [(c, models.initial_arrays(c, data.load(c.data, c.seed, c.seq_len))) for c in cfgs
            if c.strategy not in twin_of]
    if n == 1:
        out = {}
        for cfg, init in jobs:
            res = train_rank(0, 1, cfg, init, False, device=torch.device("cpu"))
            out[cfg.strategy] = {"step_times": list(res.step_times), "losses": list(res.losses)}
    else:
        per_rank = launch.launch(_torch_rank, n, jobs, platform="cpu", timeout_s=900, pg_timeout_s=120)
        out = {cfg.strategy: r for (cfg, _), r in zip(jobs, per_rank[0], strict=False)}
    return out | {name: {**out[twin], "timed_as": twin} for name, twin in twin_of.items()}


def run_jax(cfg: RunConfig) -> dict:
    res = train.run(cfg, record=False, progress=False)
    return {"step_times": list(res.step_times), "losses": list(res.losses)}


def _entry(cfg: RunConfig, res: dict) -> dict:
    return {"strategy": cfg.strategy, "devices": cfg.devices, "kernels": cfg.kernels, "compile": cfg.compile,
            **timing(res["step_times"]),
            "loss_first": res["losses"][0], "loss_last": res["losses"][-1],
            **({"timed_as": res["timed_as"]} if "timed_as" in res else {})}


def time_strategies(p: Plan, say) -> dict:
    """{model: {framework: {`tables.key`, "strategy@N" (and the path when not mirrored): timing + losses}}}; per
    model, N and kernels path, the torch world runs first, then the JAX strategies, in the same process run."""
    out = {}
    for label, n, cfgs in time_runs(p):
        rows = out.setdefault(label, {"jax": {}, "torch": {}})
        cfgs = [c.validate("jax") for c in cfgs]
        path = f" ({cfgs[0].kernels})"
        say(f"bench: {label} N={n}{path}: torch_ref {', '.join(c.strategy for c in cfgs)}")
        t_res = run_torch(cfgs, n)
        for c in cfgs:
            say(f"bench: {label} N={n}{path}: jaxdp {c.strategy}")
            rows["jax"][key(c.strategy, n, c.kernels)] = _entry(c, run_jax(c))
            rows["torch"][key(c.strategy, n, c.kernels)] = _entry(c, t_res[c.strategy])
    return out


# ---- compiled programs: communication, memory, compile time (items 4, 5, 6) ---------------------


def inspect(cfg: RunConfig) -> dict:
    """Compile `cfg`'s step on N simulated CPU devices (`accounting.measure_step`): compile time, HLO
    communication against theory, per-device state bytes (device 0) against the ZeRO formula, and
    temporaries. The gradient's bytes come from a second program that returns it (return_grads);
    the communication is the first's, which returns no grads."""
    acc = accounting.measure_step(cfg.replace(platform="cpu"))
    comm, itemsize, theory = acc["comm"], acc["param_bytes"], acc["theory"]
    kinds = [k for k in comm if k != "total"]
    return {"lower_s": acc["lower_s"], "compile_s": acc["compile_s"], "psi": acc["psi"], "itemsize": itemsize,
            "comm": {k: (v if k == "total" else v["sent"]) for k, v in comm.items()},
            "comm_max": sum(comm[k]["max_sent"] for k in kinds),
            "comm_ops": {k: comm[k]["ops"] for k in kinds},
            "comm_theory": theory,
            "memory": {**acc["measured"], "total": sum(acc["measured"].values())},
            "memory_formula": {**acc["formula"], "total": sum(acc["formula"].values())},
            "temp_bytes": acc["temp_bytes"], "peak_bytes": acc["peak_bytes"],
            **({"stats_comm": acc["stats_comm"], "stats_theory": acc["stats_theory"]} if "stats_comm" in acc else {})}


class Inspection:
    """Items 4-5 need up to 16 simulated devices, and the device count of a process is fixed at
    first use; a process with 16 CPU devices runs `single` ~25% slower than one with 1 (profiled),
    so these compiles run in a child process and the timed runs keep only the devices they use.
    Started by `start_inspect`, bound to this process (`lifeline`: it dies with it); `result()` waits for it
    (at most 30 minutes) and reads its JSON; `stop()` kills it if it still runs."""

    def __init__(self, p: Plan):
        code = (f"import json, sys; from jaxdp.core.process import lifeline; lifeline.bind_to({os.getpid()}); "
                f"from jaxdp.harness.bench import measure; json.dump(measure.child({p.quick!r}), sys.stdout)")
        self.err = tempfile.TemporaryFile("w+")  # a file, not a pipe: its progress lines never block it
        self.proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=self.err,
                                     text=True, process_group=0)  # Ctrl-C reaches the bench alone, which reaps it

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def result(self) -> dict:
        try:
            out, _ = self.proc.communicate(timeout=1800)
        except BaseException:
            self.stop()
            raise
        finally:
            self.err.seek(0)
            err = self.err.read()
            self.err.close()
        if self.proc.returncode:
            raise RuntimeError(f"bench: the compile child failed:\n{err[-4000:]}")
        return json.loads(out)


def start_inspect(p: Plan, say) -> Inspection:
    say(f"bench: compiling {len(p.comm_strategies)} strategies on {', '.join(map(str, p.comm_ns))} devices "
        f"(HLO bytes, memory) in a child process")
    return Inspection(p)


def child(quick: bool) -> dict:
    """In the child process: every strategy of items 4-5 at every N, with enough simulated devices."""
    p = plan(quick)
    devices.setup(max(p.comm_ns + tuple(n for *_, ns in p.model_comm for n in ns)), "cpu")
    out = {}
    for model, prefix, cfg in comm_runs(p):  # keys: the comm model's "strategy@N", others prefixed
        name, n = cfg.strategy, cfg.devices
        print(f"bench: compiling {model} {name} on {n} devices (HLO bytes, memory)", file=sys.stderr, flush=True)
        out[f"{prefix}{name}@{n}"] = {"model": model, "strategy": name, "devices": n, **inspect(cfg.validate("jax"))}
    return jsonable(out)
