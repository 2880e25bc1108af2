"""`jaxdp bench`: performance, measured side by side in one run, reported as ratios.

Seven measurements (the keys of the result dictionary, written to bench.json by the CLI):

1. `step_time`: JAX vs torch step time for every strategy both have, at N = 2 and 4, on one
   `mlp` large enough that compute matters and one small `gpt`: same model, batch, dtype and
   initial parameters on both sides; the first (compiling) step and one warm-up step excluded,
   the median of the rest.
2. `dp_overhead`: each strategy at N devices over `single` on the same global batch and cores.
3. `ring_vs_xla`: the explicit ring (`ddp-ring`) over XLA's all-reduce (`ddp`).
4. `communication`: bytes sent per device per step read from the compiled HLO, against the ring
   theory (`accounting.theory`), for N = 2, 4, 8, 16.
5. `memory`: per-device state bytes (parameters, gradient, optimizer state) against N, measured
   from the arrays' shards on device 0, next to the ZeRO formula.
6. `compile`: lowering + compilation time of each JAX step, and the first step of each framework.
7. `gpu_throughput`: on a GPU only: tokens/s, TFLOP/s and MFU of a bf16 `gpt` on one device.

Items 1-6 run on simulated CPU devices (`--platform cpu`) on every machine: the "devices" share
the machine's cores, and torch's ranks are processes (gloo) on the same cores, so times say how
the programs schedule on this CPU, not how they would communicate on a GPU cluster. Bytes and
memory do not depend on the machine.
"""
from __future__ import annotations

import datetime
import math
import os
import platform as platform_mod
import time
from dataclasses import dataclass, field

import numpy as np

from .config import FRAMEWORK_STRATEGIES, RunConfig

SHARED = tuple(s for s in FRAMEWORK_STRATEGIES["jax"] if s in FRAMEWORK_STRATEGIES["torch"])
JAX_ALL = FRAMEWORK_STRATEGIES["jax"]
WARMUP_STEPS = 1  # excluded after the first (compiling) step
OVERHEAD_GOAL = {"ddp": 1.15, "zero1": 1.15, "zero2": 1.15}
RING_GOAL = 1.25
MFU_GOAL = 0.45
# Dense (no sparsity) bf16 tensor-core peaks from NVIDIA's datasheets, FLOP/s.
PEAK_BF16 = (("H100 PCIe", 756e12, "NVIDIA H100 PCIe datasheet: 756 TFLOP/s bf16 dense"),
             ("H100", 989e12, "NVIDIA H100 SXM datasheet: 989 TFLOP/s bf16 dense (1979 with sparsity)"),
             ("H200", 989e12, "NVIDIA H200 SXM datasheet: 989 TFLOP/s bf16 dense"),
             ("A100", 312e12, "NVIDIA A100 datasheet: 312 TFLOP/s bf16 dense"))
FLOPS_FORMULA = ("FLOPs per token = 6 x Psi (all parameters, embeddings included) + 12 x n_layer x seq_len x "
                 "d_model (attention scores and weighted sum, forward + backward, causal mask not halved)")


@dataclass(frozen=True)
class Plan:
    """What to run: sizes, device counts and strategies per item."""
    quick: bool
    steps: int                      # per timed run: 1 compile + WARMUP_STEPS + the timed rest
    models: dict                    # label -> RunConfig (item 1-3, 6)
    time_ns: tuple                  # device counts for items 1-3
    time_strategies: tuple          # shared strategies timed (single always)
    comm_ns: tuple                  # items 4-5
    comm_strategies: tuple
    comm_model: RunConfig
    gpu_model: RunConfig
    gpu_steps: int
    extra: dict = field(default_factory=dict)


def plan(quick: bool) -> Plan:
    base = RunConfig(optimizer="adamw", dtype="float32", platform="cpu", seed=0, lr=1e-3)
    if quick:
        # A smoke run (the test suite's): one small model, one device count, every item present.
        models = {"mlp": base.replace(model="mlp", data="synthetic", hidden=(64, 64), batch_size=32)}
        return Plan(True, 4, models, (2,), ("single", "ddp", "ddp-ring"), (2,), ("ddp", "zero3"),
                    models["mlp"], _gpu_config(base), 4)
    models = {"mlp": base.replace(model="mlp", data="synthetic", hidden=(1024, 1024), batch_size=512),
              "gpt": base.replace(model="gpt", data="text", n_layer=2, n_head=4, d_model=128, seq_len=64,
                                  batch_size=32)}
    return Plan(False, 12, models, (2, 4), SHARED, (2, 4, 8, 16), tuple(s for s in JAX_ALL if s != "single"),
                base.replace(model="mlp", data="synthetic", hidden=(1024, 1024), batch_size=256),
                _gpu_config(base), 30)


def _gpu_config(base: RunConfig) -> RunConfig:
    return base.replace(model="gpt", data="text", strategy="single", devices=1, dtype="bfloat16", n_layer=12,
                        n_head=12, d_model=768, seq_len=1024, batch_size=16, platform="gpu")


# ---- timing (items 1, 2, 3, 6) ------------------------------------------------------------------

def timing(step_times) -> dict:
    """First step (compile), warm-up excluded, median and quartiles of the rest."""
    times = [float(t) for t in step_times]
    timed = np.asarray(times[1 + WARMUP_STEPS:] or times[-1:], dtype=float)
    return {"first_step_s": times[0] if times else math.nan, "median_step_s": float(np.median(timed)),
            "p25_step_s": float(np.percentile(timed, 25)), "p75_step_s": float(np.percentile(timed, 75)),
            "timed_steps": int(timed.size)}


def _torch_times(res) -> list:
    """torch_ref RunResult -> per-step times (older results carry only first_step_s / steps_per_s)."""
    times = getattr(res, "step_times", None)
    if times:
        return list(times)
    steps = res.cfg.steps
    return [res.first_step_s] + [1.0 / max(res.steps_per_s, 1e-9)] * (steps - 1)


def _torch_rank(rank: int, n: int, jobs: list) -> list:
    """Runs in each spawned torch rank: every job of this world, no trace recording."""
    from torch_ref.train import train_rank

    out = []
    for cfg, init in jobs:
        res = train_rank(rank, n, cfg, init, False)
        out.append(None if res is None else {"step_times": _torch_times(res), "losses": list(res.losses)})
    return out


def run_torch(cfgs: list, n: int) -> dict:
    """{strategy: {"step_times", "losses"}} for configs of one device count: a spawned gloo world of
    n ranks runs them all (one spawn per world); n = 1 runs in this process."""
    import torch

    from torch_ref import launch
    from torch_ref import models as torch_models
    from torch_ref.train import train_rank

    from . import data

    jobs = [(c, torch_models.jax_init(c, data.load(c.data, c.seed, c.seq_len))) for c in cfgs]
    if n == 1:
        out = {}
        for cfg, init in jobs:
            res = train_rank(0, 1, cfg, init, False, device=torch.device("cpu"))
            out[cfg.strategy] = {"step_times": _torch_times(res), "losses": list(res.losses)}
        return out
    per_rank = launch.launch(_torch_rank, n, jobs, platform="cpu", timeout_s=900, pg_timeout_s=120)
    return {cfg.strategy: r for (cfg, _), r in zip(jobs, per_rank[0], strict=False)}


def run_jax(cfg: RunConfig) -> dict:
    from . import train

    res = train.run(cfg, record=False, progress=False)
    return {"step_times": list(res.step_times), "losses": list(res.losses)}


def time_strategies(p: Plan, say) -> dict:
    """{model: {framework: {"strategy@N": timing + losses}}}; per model and N, the torch world runs
    first, then the JAX strategies, in the same process run."""
    out = {}
    for label, base in p.models.items():
        rows = {"jax": {}, "torch": {}}
        for n in (1,) + tuple(p.time_ns):
            names = ["single"] if n == 1 else [s for s in p.time_strategies if s != "single"]
            cfgs = [base.replace(strategy=s, devices=n, steps=p.steps).validate("jax") for s in names]
            say(f"bench: {label} N={n}: torch_ref {', '.join(names)}")
            t_res = run_torch(cfgs, n)
            for c in cfgs:
                say(f"bench: {label} N={n}: jaxdp {c.strategy}")
                j_res = run_jax(c)
                for fw, res in (("jax", j_res), ("torch", t_res[c.strategy])):
                    rows[fw][f"{c.strategy}@{n}"] = {"strategy": c.strategy, "devices": n,
                                                    **timing(res["step_times"]),
                                                    "loss_first": res["losses"][0], "loss_last": res["losses"][-1]}
        out[label] = rows
    return out


def _ratio(a, b):
    return float(a / b) if b and np.isfinite(a) and np.isfinite(b) else None


def step_time_table(times: dict) -> list:
    rows = []
    for label, fws in times.items():
        for key, j in fws["jax"].items():
            t = fws["torch"][key]
            rows.append({"model": label, "strategy": j["strategy"], "devices": j["devices"],
                         "jax_s": j["median_step_s"], "torch_s": t["median_step_s"],
                         "jax_over_torch": _ratio(j["median_step_s"], t["median_step_s"]),
                         "jax_p25_p75": [j["p25_step_s"], j["p75_step_s"]],
                         "torch_p25_p75": [t["p25_step_s"], t["p75_step_s"]],
                         "loss_last": {"jax": j["loss_last"], "torch": t["loss_last"]}})
    return rows


def overhead_table(times: dict) -> list:
    rows = []
    for label, fws in times.items():
        for fw, entries in fws.items():
            single = entries["single@1"]["median_step_s"]
            for _key, e in entries.items():
                if e["strategy"] == "single":
                    continue
                ratio = _ratio(e["median_step_s"], single)
                goal = OVERHEAD_GOAL.get(e["strategy"])
                rows.append({"model": label, "framework": fw, "strategy": e["strategy"], "devices": e["devices"],
                             "step_s": e["median_step_s"], "single_s": single, "over_single": ratio,
                             "goal": goal, "met": None if goal is None or ratio is None else ratio <= goal})
    return rows


def ring_table(times: dict) -> list:
    rows = []
    for label, fws in times.items():
        for fw, entries in fws.items():
            for _key, e in entries.items():
                if e["strategy"] != "ddp-ring":
                    continue
                ddp = entries.get(f"ddp@{e['devices']}")
                if ddp is None:
                    continue
                ratio = _ratio(e["median_step_s"], ddp["median_step_s"])
                rows.append({"model": label, "framework": fw, "devices": e["devices"], "ring_s": e["median_step_s"],
                             "ddp_s": ddp["median_step_s"], "ring_over_ddp": ratio,
                             "met": None if ratio is None else ratio <= RING_GOAL})
    return rows


# ---- compiled programs: communication, memory, compile time (items 4, 5, 6) ---------------------

def dp_theory(sizes, n: int, itemsize: int) -> dict:
    """`dp`'s binomial tree: the reduce to device 0 and the broadcast from it each move N-1
    messages of Psi values in all, so the mean device sends 2 (N-1)/N Psi (the busiest, device 0,
    sends ceil(log2 N) Psi in the broadcast). The loss is read on device 0: no extra collective."""
    psi = sum(sizes) * itemsize
    p2p = 2 * (n - 1) / n * psi if n > 1 else 0.0
    return {"all-reduce": 0.0, "reduce-scatter": 0.0, "all-gather": 0.0, "point-to-point": p2p, "total": p2p}


def inspect(cfg: RunConfig) -> dict:
    """Compile `cfg`'s step on N simulated CPU devices: compile time, HLO communication, per-device
    state bytes (device 0) and temporaries. The gradient's bytes come from a second program that
    returns it (return_grads), run once; the communication is the first's, which returns no grads."""
    import jax

    from . import accounting, devices, models, strategies, train

    devs, dataset, problem, optimizer, s = train.prepare(cfg.replace(platform="cpu"))
    mesh = devices.mesh(devs)
    x, y = train.host_batch(cfg, dataset, 1)
    state = s.init(problem.params)
    batch = s.put_batch(x, y)
    t0 = time.perf_counter()
    lowered = s.compiled_step.lower(state, *batch)
    t1 = time.perf_counter()
    compiled = lowered.compile()
    t2 = time.perf_counter()
    comm = accounting.communication(compiled.as_text(), cfg.devices)
    analysis = compiled.memory_analysis()
    mem = {"params": accounting.bytes_on(state.params, devs[0]),
           "opt_state": accounting.bytes_on(state.opt_state, devs[0])}

    g = strategies.make(cfg.strategy, problem, optimizer, mesh, cfg, return_grads=True)
    g_state = g.init(problem.params)
    _, metrics = g.compiled_step(g_state, *g.put_batch(x, y))  # the jitted step: grads as the devices hold them
    mem["grads"] = accounting.bytes_on(metrics["grads"], devs[0])
    mem["total"] = mem["params"] + mem["grads"] + mem["opt_state"]

    itemsize = np.dtype(models.MASTER_DTYPE[cfg.dtype]).itemsize
    sizes = [int(np.prod(a.shape)) for a in jax.tree.leaves(problem.params)]
    scalars = sum(leaf.dtype.itemsize for leaf in jax.tree.leaves(jax.eval_shape(optimizer.init, problem.params))
                  if leaf.ndim == 0)
    k_bytes = accounting.STATE_ARRAYS_PER_PARAM[cfg.optimizer] * itemsize
    formula = accounting.formula(accounting.STAGE[cfg.strategy], sizes, cfg.devices, itemsize, itemsize, k_bytes, scalars)
    formula["total"] = sum(formula.values())
    theory = (dp_theory(sizes, cfg.devices, itemsize) if cfg.strategy == "dp"
              else accounting.theory(cfg.strategy, sizes, cfg.devices, itemsize))
    return {"lower_s": t1 - t0, "compile_s": t2 - t1, "psi": sum(sizes), "itemsize": itemsize,
            "comm": {k: (v if k == "total" else v["sent"]) for k, v in comm.items()},
            "comm_max": sum(v["max_sent"] for k, v in comm.items() if k != "total"),
            "comm_ops": {k: v["ops"] for k, v in comm.items() if k != "total"},
            "comm_theory": theory, "memory": mem, "memory_formula": formula,
            "temp_bytes": int(getattr(analysis, "temp_size_in_bytes", -1)) if analysis is not None else -1}


COMM_NOTES = {
    "zero3": "theory gathers the parameters twice (forward and again for backward: 3(N-1)/N Psi); the program "
             "does, but XLA:CPU drops jax.checkpoint's optimization barrier and merges the two identical "
             "all-gathers, so the executed step sends zero2's 2(N-1)/N Psi (docs/STRATEGIES.md)",
    "dp": "theory: binomial tree, mean over devices 2(N-1)/N Psi; device 0 sends ceil(log2 N) Psi (comm_max)",
}


def inspect_all(p: Plan, say) -> dict:
    """Items 4-5 need up to 16 simulated devices, and the device count of a process is fixed at
    first use; a process with 16 CPU devices runs `single` ~25% slower than one with 1 (profiled),
    so these compiles run in a child process and the timed runs keep only the devices they use."""
    import json
    import subprocess
    import sys

    say(f"bench: compiling {len(p.comm_strategies)} strategies on {', '.join(map(str, p.comm_ns))} devices "
        f"(HLO bytes, memory) in a child process")
    code = f"import json, sys; from jaxdp import bench; json.dump(bench._inspect_child({p.quick!r}), sys.stdout)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=1800)
    if proc.returncode:
        raise RuntimeError(f"bench: the compile child failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout)


def _inspect_child(quick: bool) -> dict:
    from . import devices

    p = plan(quick)
    devices.setup(max(p.comm_ns), "cpu")
    return _jsonable(_inspect_all(p, lambda m: print(m, file=__import__("sys").stderr, flush=True)))


def _inspect_all(p: Plan, say) -> dict:
    out = {}
    for name in p.comm_strategies:
        for n in p.comm_ns:
            say(f"bench: compiling {name} on {n} devices (HLO bytes, memory)")
            cfg = p.comm_model.replace(strategy=name, devices=n).validate("jax")
            out[f"{name}@{n}"] = {"strategy": name, "devices": n, **inspect(cfg)}
    return out


def communication_table(inspected: dict) -> list:
    rows = []
    for e in inspected.values():
        measured, theory = e["comm"]["total"], e["comm_theory"]["total"]
        ratio = _ratio(measured, theory)
        rows.append({"strategy": e["strategy"], "devices": e["devices"], "measured_bytes": measured,
                     "theory_bytes": theory, "measured_over_theory": ratio,
                     "measured_over_psi_bytes": measured / (e["psi"] * e["itemsize"]),
                     "busiest_device_bytes": e["comm_max"], "ops": e["comm_ops"],
                     "by_kind": {k: v for k, v in e["comm"].items() if k != "total"},
                     "equal_to_theory": ratio is not None and abs(ratio - 1) < 1e-6,
                     "note": COMM_NOTES.get(e["strategy"], "") if ratio is None or abs(ratio - 1) >= 1e-6 else ""})
    return rows


def memory_table(inspected: dict) -> list:
    rows = []
    for e in inspected.values():
        m, f = e["memory"], e["memory_formula"]
        rows.append({"strategy": e["strategy"], "devices": e["devices"], **{k: m[k] for k in ("params", "grads", "opt_state", "total")},
                     "formula": f, "equal_to_formula": all(m[k] == f[k] for k in ("params", "grads", "opt_state")),
                     "temp_bytes": e["temp_bytes"]})
    return rows


def compile_table(inspected: dict, times: dict) -> list:
    rows = []
    for e in inspected.values():
        rows.append({"source": "compile", "model": "mlp (item 4)", "strategy": e["strategy"], "devices": e["devices"],
                     "lower_s": e["lower_s"], "compile_s": e["compile_s"]})
    for label, fws in times.items():
        for key, j in fws["jax"].items():
            rows.append({"source": "first_step", "model": label, "strategy": j["strategy"], "devices": j["devices"],
                         "jax_first_step_s": j["first_step_s"], "torch_first_step_s": fws["torch"][key]["first_step_s"]})
    return rows


# ---- GPU throughput (item 7) --------------------------------------------------------------------

def gpu_available() -> dict:
    import jax

    try:
        jax_gpu = bool(jax.devices("gpu"))
    except RuntimeError:
        jax_gpu = False
    try:
        import torch

        torch_gpu = torch.cuda.is_available()
    except ImportError:
        torch_gpu = False
    return {"jax": jax_gpu, "torch": torch_gpu}


def flops_per_token(psi: int, cfg: RunConfig) -> float:
    return 6.0 * psi + 12.0 * cfg.n_layer * cfg.seq_len * cfg.d_model


def peak_flops(device_kind: str):
    for name, peak, source in PEAK_BF16:
        if all(word.lower() in device_kind.lower() for word in name.split()):
            return peak, source
    return None, f"no datasheet peak known for {device_kind!r}"


def throughput(cfg: RunConfig, steps: int) -> dict:
    """bf16 `gpt` training throughput of `single` on one device of cfg.platform, both frameworks.
    (platform 'cpu' runs the same code path, for testing it without a GPU.)"""
    import jax

    from . import data, models

    cfg = cfg.replace(steps=steps).validate("jax")
    dataset = data.load(cfg.data, cfg.seed, cfg.seq_len)
    with jax.default_device(jax.devices("cpu")[0]):
        psi = sum(int(np.prod(a.shape)) for a in jax.tree.leaves(models.init(cfg, dataset).params))
    per_token = flops_per_token(psi, cfg)
    tokens = cfg.batch_size * cfg.seq_len
    kind = jax.devices(cfg.platform)[0].device_kind if cfg.platform != "auto" else jax.devices()[0].device_kind
    peak, source = peak_flops(kind) if cfg.platform == "gpu" else (None, "CPU: no datasheet peak")
    out = {"measured": True, "device": kind, "config": {k: getattr(cfg, k) for k in
           ("n_layer", "n_head", "d_model", "seq_len", "batch_size", "dtype")}, "psi": psi,
           "flops_per_token": per_token, "flops_formula": FLOPS_FORMULA, "peak_flops": peak, "peak_source": source,
           "frameworks": {}}

    def record(fw, step_times, note=""):
        t = timing(step_times)
        tflops = per_token * tokens / t["median_step_s"]
        out["frameworks"][fw] = {**t, "tokens_per_s": tokens / t["median_step_s"], "tflops": tflops / 1e12,
                                 "mfu": tflops / peak if peak else None, "note": note}

    record("jax", run_jax(cfg)["step_times"])
    try:
        import torch

        from torch_ref import models as torch_models
        from torch_ref.train import train_rank

        device = torch.device("cuda" if cfg.platform == "gpu" else "cpu")
        res = train_rank(0, 1, cfg, torch_models.jax_init(cfg, dataset), False, device=device)
        record("torch", _torch_times(res), "eager (torch_ref has no torch.compile switch)")
    except Exception as e:  # report, never hide: the JAX number stands on its own
        out["frameworks"]["torch"] = {"error": f"{type(e).__name__}: {e}"}
    j, t = out["frameworks"]["jax"], out["frameworks"]["torch"]
    out["jax_over_torch_tokens_per_s"] = _ratio(j["tokens_per_s"], t.get("tokens_per_s", math.nan))
    return out


def gpu_throughput(p: Plan, say) -> dict:
    have = gpu_available()
    if not (have["jax"] and have["torch"]):
        return {"measured": False, "reason": "not measured: no GPU on this machine", "gpu_seen": have,
                "flops_formula": FLOPS_FORMULA, "peak_source": PEAK_BF16[1][2],
                "config": {k: getattr(p.gpu_model, k) for k in ("n_layer", "n_head", "d_model", "seq_len", "batch_size", "dtype")}}
    say("bench: GPU throughput, bf16 gpt on one device")
    cfg = p.gpu_model if not p.quick else p.gpu_model.replace(n_layer=2, d_model=256, n_head=4, seq_len=256)
    return throughput(cfg, p.gpu_steps)


# ---- the whole bench ----------------------------------------------------------------------------

def machine() -> dict:
    cpu = platform_mod.processor() or platform_mod.machine()
    try:
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        cpu = names[0] if names else cpu
    except OSError:
        pass
    from . import train

    versions = train.versions()
    try:
        import torch

        versions["torch"] = torch.__version__
    except ImportError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform_mod.python_version(),
            "system": f"{platform_mod.system()} {platform_mod.release()}", "versions": versions}


def goals(results: dict) -> list:
    """One line per goal of the issue: met / not met / not measured, with the numbers behind it."""
    out = []
    st = [r for r in results["step_time"]["rows"] if r["jax_over_torch"] is not None]
    worst = max(st, key=lambda r: r["jax_over_torch"])
    out.append({"item": 1, "goal": "JAX at least as fast as torch for every strategy (JAX/torch <= 1)",
                "met": all(r["jax_over_torch"] <= 1.0 for r in st),
                "detail": f"worst {worst['jax_over_torch']:.2f}x ({worst['model']} {worst['strategy']} N={worst['devices']}); "
                          f"{sum(r['jax_over_torch'] <= 1.0 for r in st)}/{len(st)} rows met"})
    ov = [r for r in results["dp_overhead"]["rows"] if r["framework"] == "jax" and r["goal"] is not None]
    out.append({"item": 2, "goal": "ddp, zero1, zero2 at most 1.15x single (JAX)",
                "met": bool(ov) and all(r["met"] for r in ov),
                "detail": ", ".join(f"{r['model']} {r['strategy']}@{r['devices']} {r['over_single']:.2f}x" for r in ov)})
    rg = [r for r in results["ring_vs_xla"]["rows"] if r["framework"] == "jax"]
    out.append({"item": 3, "goal": "ddp-ring at most 1.25x ddp (JAX)", "met": bool(rg) and all(r["met"] for r in rg),
                "detail": ", ".join(f"{r['model']}@{r['devices']} {r['ring_over_ddp']:.2f}x" for r in rg)})
    cm = results["communication"]["rows"]
    off = [r for r in cm if not r["equal_to_theory"]]
    out.append({"item": 4, "goal": "HLO bytes per device equal to theory",
                "met": not off, "detail": f"{len(cm) - len(off)}/{len(cm)} equal; differ: "
                + (", ".join(sorted({f"{r['strategy']} ({r['measured_over_theory']:.3f}x)" for r in off})) or "none")})
    mm = results["memory"]["rows"]
    out.append({"item": 5, "goal": "sharded state falls as 1/N (measured = ZeRO formula, exact padding)",
                "met": all(r["equal_to_formula"] for r in mm),
                "detail": f"{sum(r['equal_to_formula'] for r in mm)}/{len(mm)} rows equal to the formula"})
    out.append({"item": 6, "goal": "compilation time per strategy (reported, no target)", "met": None,
                "detail": "see the table"})
    g = results["gpu_throughput"]
    if not g.get("measured"):
        out.append({"item": 7, "goal": f"MFU >= {MFU_GOAL:.0%} on an H100 and jaxdp >= torch", "met": None,
                    "detail": g.get("reason", "not measured")})
    else:
        mfu = g["frameworks"]["jax"].get("mfu")
        ratio = g.get("jax_over_torch_tokens_per_s")
        out.append({"item": 7, "goal": f"MFU >= {MFU_GOAL:.0%} on an H100 and jaxdp >= torch",
                    "met": bool(mfu is not None and mfu >= MFU_GOAL and ratio is not None and ratio >= 1.0),
                    "detail": f"{g['device']}: JAX MFU {mfu if mfu is None else f'{mfu:.1%}'}, jaxdp/torch tokens/s "
                              f"{ratio if ratio is None else f'{ratio:.2f}'}"})
    return out


def _passive_omp() -> str:
    """torch's OpenMP threads spin-wait by default; on this 2-core machine a spinning worker starves
    the thread it waits for and a 0.7 ms step of the small mlp takes ~100 ms with 2 threads
    (profiled: see docs/BENCHMARKS.md). PASSIVE (sleep while waiting) must be set before torch
    loads libgomp; the spawned ranks inherit it. Returns what torch runs with."""
    import sys

    if "torch" not in sys.modules:
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        return os.environ["OMP_WAIT_POLICY"]
    return os.environ.get("OMP_WAIT_POLICY", "default") + " (torch was imported before the bench set it)"


def run(quick: bool = False, out: str | None = None, progress=None) -> dict:
    """Run every item; returns the JSON-serialisable result (the CLI writes bench.json / bench.md)."""
    say = progress or (lambda m: print(m, flush=True))
    p = plan(quick)
    omp = _passive_omp()
    from . import devices

    devices.setup(max(p.time_ns), "cpu")  # before JAX initialises: the count is then fixed
    t0 = time.perf_counter()
    times = time_strategies(p, say)
    inspected = inspect_all(p, say)
    results = {
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "quick": quick,
        "machine": machine(),
        "setup": {"omp_wait_policy": omp, "platform": "cpu (simulated devices share the cores; torch ranks are gloo processes on the same cores)",
                  "steps_per_run": p.steps, "excluded": f"first step (compile) + {WARMUP_STEPS} warm-up",
                  "timed_steps": p.steps - 1 - WARMUP_STEPS, "statistic": "median",
                  "models": {k: {f: getattr(c, f) for f in ("model", "data", "hidden", "n_layer", "n_head", "d_model",
                                                           "seq_len", "batch_size", "dtype", "optimizer")}
                             for k, c in p.models.items()},
                  "comm_model": {f: getattr(p.comm_model, f) for f in ("model", "hidden", "batch_size", "dtype", "optimizer")}},
        "step_time": {"rows": step_time_table(times)},
        "dp_overhead": {"rows": overhead_table(times)},
        "ring_vs_xla": {"rows": ring_table(times)},
        "communication": {"rows": communication_table(inspected)},
        "memory": {"rows": memory_table(inspected)},
        "compile": {"rows": compile_table(inspected, times)},
        "gpu_throughput": gpu_throughput(p, say),
    }
    results["goals"] = goals(results)
    results["wall_s"] = time.perf_counter() - t0
    return _jsonable(results)


def _jsonable(x):
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, (np.floating, float)):
        return None if not np.isfinite(x) else float(x)
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, np.bool_):
        return bool(x)
    return x


# ---- markdown -----------------------------------------------------------------------------------

def _f(x, spec=".2f", none="-"):
    return none if x is None else format(x, spec)


def _ms(x):
    return _f(None if x is None else 1e3 * x, ".1f")


def _mark(met):
    return {True: "met", False: "NOT met", None: "-"}[met]


def markdown(results: dict) -> str:
    m = results["machine"]
    v = m["versions"]
    s = results["setup"]
    lines = [f"# jaxdp bench{' (--quick)' if results.get('quick') else ''}", "",
             f"Machine: {m['cpu']}, {m['cores']} cores, {m['system']}; Python {m['python']}, JAX {v.get('jax')}, "
             f"jaxlib {v.get('jaxlib')}, flax {v.get('flax')}, optax {v.get('optax')}, torch {v.get('torch')}, "
             f"numpy {v.get('numpy')}. Run {results['created']}, {results['wall_s']:.0f} s.", "",
             f"Items 1-6 on {s['platform']}. Each timed run: {s['steps_per_run']} steps, {s['excluded']} excluded, "
             f"{s['statistic']} of {s['timed_steps']}. Models: "
             + "; ".join(f"`{k}` " + _model_text(c) for k, c in s["models"].items()) + ".", "",
             "## Goals", "", "| item | goal | status | detail |", "|---|---|---|---|"]
    for g in results["goals"]:
        lines.append(f"| {g['item']} | {g['goal']} | {_mark(g['met']) if g['item'] not in (6,) else 'reported'}"
                     f"{' (not measured)' if g['item'] == 7 and g['met'] is None else ''} | {g['detail']} |")

    lines += ["", "## 1. Step time, JAX vs torch (median ms; same model, batch, dtype, initial parameters)", "",
              "| model | strategy | N | JAX ms | torch ms | JAX/torch |", "|---|---|---:|---:|---:|---:|"]
    for r in results["step_time"]["rows"]:
        lines.append(f"| {r['model']} | {r['strategy']} | {r['devices']} | {_ms(r['jax_s'])} | {_ms(r['torch_s'])} | "
                     f"{_f(r['jax_over_torch'])} |")

    lines += ["", "## 2. Data-parallel overhead: strategy at N over `single` (same global batch, same cores)", "",
              "| model | strategy | N | JAX | torch | goal |", "|---|---|---:|---:|---:|---:|"]
    by = {}
    for r in results["dp_overhead"]["rows"]:
        by.setdefault((r["model"], r["strategy"], r["devices"]), {})[r["framework"]] = r
    for (model, strat, n), fw in by.items():
        goal = fw.get("jax", fw.get("torch"))["goal"]
        lines.append(f"| {model} | {strat} | {n} | {_f(fw.get('jax', {}).get('over_single'))}x | "
                     f"{_f(fw.get('torch', {}).get('over_single'))}x | {'<= ' + _f(goal) if goal else '-'} |")

    lines += ["", "## 3. Explicit ring vs XLA's all-reduce (`ddp-ring` / `ddp`, goal <= 1.25)", "",
              "| model | N | JAX ring/ddp | torch ring/ddp |", "|---|---:|---:|---:|"]
    rby = {}
    for r in results["ring_vs_xla"]["rows"]:
        rby.setdefault((r["model"], r["devices"]), {})[r["framework"]] = r["ring_over_ddp"]
    for (model, n), fw in rby.items():
        lines.append(f"| {model} | {n} | {_f(fw.get('jax'))}x | {_f(fw.get('torch'))}x |")

    cm = results["communication"]["rows"]
    ns = sorted({r["devices"] for r in cm})
    lines += ["", "## 4. Communication per device per step: compiled HLO vs theory (KiB sent; measured/theory)", "",
              f"Model: {_model_text(s['comm_model'])}. Bytes do not depend on the machine.", "",
              "| strategy | " + " | ".join(f"N={n} measured | theory | ratio" for n in ns) + " |",
              "|---|" + "---:|---:|---:|" * len(ns)]
    cby = {}
    for r in cm:
        cby.setdefault(r["strategy"], {})[r["devices"]] = r
    for strat, per_n in cby.items():
        cells = []
        for n in ns:
            r = per_n.get(n)
            cells.append("- | - | -" if r is None else
                         f"{r['measured_bytes'] / 1024:.1f} | {r['theory_bytes'] / 1024:.1f} | {_f(r['measured_over_theory'], '.3f')}")
        lines.append(f"| {strat} | " + " | ".join(cells) + " |")
    notes = {r["strategy"]: r["note"] for r in cm if r["note"]}
    for strat, note in notes.items():
        lines.append(f"\n- `{strat}` differs from theory: {note}.")

    mm = results["memory"]["rows"]
    lines += ["", "## 5. Per-device state memory vs N (KiB on device 0: params / grads / optimizer state; = formula?)", "",
              "| strategy | " + " | ".join(f"N={n}" for n in ns) + " |", "|---|" + "---|" * len(ns)]
    mby = {}
    for r in mm:
        mby.setdefault(r["strategy"], {})[r["devices"]] = r
    for strat, per_n in mby.items():
        cells = []
        for n in ns:
            r = per_n.get(n)
            cells.append("-" if r is None else f"{r['params'] / 1024:.0f} / {r['grads'] / 1024:.0f} / "
                         f"{r['opt_state'] / 1024:.0f} {'=' if r['equal_to_formula'] else '!= formula'}")
        lines.append(f"| {strat} | " + " | ".join(cells) + " |")

    rows = results["compile"]["rows"]
    lines += ["", "## 6. Compilation time", "", "JAX step, lowering + XLA compile (s), by N:", "",
              "| strategy | " + " | ".join(f"N={n}" for n in ns) + " |", "|---|" + "---:|" * len(ns)]
    kby = {}
    for r in rows:
        if r["source"] == "compile":
            kby.setdefault(r["strategy"], {})[r["devices"]] = r["lower_s"] + r["compile_s"]
    for strat, per_n in kby.items():
        lines.append(f"| {strat} | " + " | ".join(_f(per_n.get(n)) for n in ns) + " |")
    lines += ["", "First step (s; JAX: trace + compile + run; torch: eager, no compilation):", "",
              "| model | strategy | N | JAX | torch |", "|---|---|---:|---:|---:|"]
    for r in rows:
        if r["source"] == "first_step":
            lines.append(f"| {r['model']} | {r['strategy']} | {r['devices']} | {_f(r['jax_first_step_s'])} | "
                         f"{_f(r['torch_first_step_s'])} |")

    g = results["gpu_throughput"]
    lines += ["", "## 7. GPU training throughput (bf16 `gpt`, one device)", ""]
    if not g.get("measured"):
        lines.append(f"{g['reason']} (JAX sees a GPU: {g['gpu_seen']['jax']}, torch: {g['gpu_seen']['torch']}). "
                     f"Configured: {_model_text(g['config'])}. {g['flops_formula']}; peak: {g['peak_source']}.")
    else:
        lines += [f"Device {g['device']}; {_model_text(g['config'])}; Psi = {g['psi']:,}. {g['flops_formula']}. "
                  f"Peak: {g['peak_source']}.", "",
                  "| framework | tokens/s | TFLOP/s | MFU | median step ms | note |", "|---|---:|---:|---:|---:|---|"]
        for fw, r in g["frameworks"].items():
            if "error" in r:
                lines.append(f"| {fw} | - | - | - | - | {r['error']} |")
            else:
                lines.append(f"| {fw} | {r['tokens_per_s']:,.0f} | {r['tflops']:.1f} | "
                             f"{'-' if r['mfu'] is None else format(r['mfu'], '.1%')} | {_ms(r['median_step_s'])} | {r['note']} |")
    return "\n".join(lines) + "\n"


def _model_text(c: dict) -> str:
    if c.get("model") == "mlp":
        return f"mlp hidden {','.join(map(str, c['hidden']))}, batch {c['batch_size']}, {c['dtype']}, {c['optimizer']}"
    parts = [f"{k} {c[k]}" for k in ("n_layer", "n_head", "d_model", "seq_len", "batch_size") if k in c]
    return f"{c.get('model', 'gpt')} " + ", ".join(parts) + f", {c.get('dtype')}" + (f", {c['optimizer']}" if "optimizer" in c else "")
