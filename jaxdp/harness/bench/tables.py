"""The measurements as bench.json's rows: ratios JAX/torch, strategy/single, ring/ddp (items 1-3),
bytes and memory against theory (items 4-5), compile and first-step times (item 6)."""
from __future__ import annotations

import numpy as np

from ...core.registry import strategies as registry
from ...core.run.config import JIT_STRATEGIES
from .. import kernel_paths
from .goals import OVERHEAD_GOAL, RING_GOAL

COMM_NOTES = {
    registry.FULLY_SHARDED:
        "theory gathers each unit twice per micro-batch (forward and again for backward: 3(N-1)/N Psi at "
        "accum 1; once with --reshard-after-forward false), as the compiled program does "
        "(tests/jaxdp/strategies/zero/test_zero3_compiled.py); a difference means the theory was not given "
        "accum or reshard",
    "dp": "theory: binomial tree, mean over devices 2(N-1)/N Psi; device 0 sends ceil(log2 N) Psi (comm_max)",
} | {name: "theory is the layout's least, one gradient reduction per step; with the default --axis-type auto the "
             "partitioner places the collectives itself (per micro-batch, or moving activations instead of "
             "gathering parameters): item 10 and docs/STRATEGIES.md" for name in JIT_STRATEGIES}


def key(strategy: str, n: int, kernels: str = "mirrored") -> str:
    """Items 1-3's key of a timed run: "strategy@N", and " fused" after it on the fused path."""
    return f"{strategy}@{n}" + ("" if kernels == "mirrored" else f" {kernels}")


def path(entry: dict, framework: str) -> str:
    """The path a timed run took, as its row says it: mirrored, fused; torch's with eager or compiled."""
    return kernel_paths.label(entry.get("kernels", "mirrored"), framework, entry.get("compile", False))


def ratio(a, b):
    return float(a / b) if b and np.isfinite(a) and np.isfinite(b) else None


def jsonable(x):
    """NumPy scalars as Python ones, non-finite floats as None (JSON has no NaN)."""
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if isinstance(x, (np.floating, float)):
        return None if not np.isfinite(x) else float(x)
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, np.bool_):
        return bool(x)
    return x


def step_time_table(times: dict) -> list:
    rows = []
    for label, fws in times.items():
        for key, j in fws["jax"].items():
            t = fws["torch"][key]
            rows.append({"model": label, "strategy": j["strategy"], "devices": j["devices"],
                         "kernels": j.get("kernels", "mirrored"), "jax_path": path(j, "jax"),
                         "torch_path": path(t, "torch"), "jax_s": j["median_step_s"], "torch_s": t["median_step_s"],
                         "jax_over_torch": ratio(j["median_step_s"], t["median_step_s"]),
                         "jax_p25_p75": [j["p25_step_s"], j["p75_step_s"]],
                         "torch_p25_p75": [t["p25_step_s"], t["p75_step_s"]],
                         "loss_last": {"jax": j["loss_last"], "torch": t["loss_last"]},
                         **({"torch_timed_as": t["timed_as"]} if "timed_as" in t else {})})
    return rows


def overhead_table(times: dict) -> list:
    rows = []
    for label, fws in times.items():
        for fw, entries in fws.items():
            for e in entries.values():
                if registry.on_one_device(e["strategy"]):
                    continue
                single = entries[key(registry.ONE_DEVICE, 1, e.get("kernels", "mirrored"))]["median_step_s"]
                over = ratio(e["median_step_s"], single)
                goal = OVERHEAD_GOAL.get(e["strategy"])
                rows.append({"model": label, "framework": fw, "strategy": e["strategy"], "devices": e["devices"],
                             "kernels": e.get("kernels", "mirrored"), "step_s": e["median_step_s"], "single_s": single,
                             "over_single": over,
                             "goal": goal, "met": None if goal is None or over is None else over <= goal})
    return rows


def ring_table(times: dict) -> list:
    rows = []
    for label, fws in times.items():
        for fw, entries in fws.items():
            for e in entries.values():
                ddp = entries.get(key(registry.REPLICATED, e["devices"], e.get("kernels", "mirrored")))
                if e["strategy"] != "ddp-ring" or ddp is None:
                    continue
                over = ratio(e["median_step_s"], ddp["median_step_s"])
                rows.append({"model": label, "framework": fw, "devices": e["devices"],
                             "kernels": e.get("kernels", "mirrored"), "ring_s": e["median_step_s"],
                             "ddp_s": ddp["median_step_s"], "ring_over_ddp": over,
                             "met": None if over is None else over <= RING_GOAL})
    return rows


def communication_table(inspected: dict) -> list:
    rows = []
    for e in inspected.values():
        measured, theory = e["comm"]["total"], e["comm_theory"]["total"]
        over = ratio(measured, theory)
        equal = over is not None and abs(over - 1) < 1e-6
        stats = {"stats_measured_bytes": e["stats_comm"], "stats_theory_bytes": e["stats_theory"]} \
            if "stats_comm" in e else {}  # BatchNorm's running statistics: their own program
        rows.append({"model": e.get("model", "mlp"), "strategy": e["strategy"], "devices": e["devices"],
                     "measured_bytes": measured,
                     "theory_bytes": theory, "measured_over_theory": over,
                     "measured_over_psi_bytes": measured / (e["psi"] * e["itemsize"]),
                     "busiest_device_bytes": e["comm_max"], "ops": e["comm_ops"],
                     "by_kind": {k: v for k, v in e["comm"].items() if k != "total"},
                     "equal_to_theory": equal, "note": "" if equal else COMM_NOTES.get(e["strategy"], ""), **stats})
    return rows


def memory_table(inspected: dict) -> list:
    parts = ("params", "grads", "opt_state")
    rows = []
    for e in inspected.values():
        m, f = e["memory"], e["memory_formula"]
        rows.append({"model": e.get("model", "mlp"), "strategy": e["strategy"], "devices": e["devices"],
                     **{k: m[k] for k in (*parts, "total")},
                     "formula": f, "equal_to_formula": all(m[k] == f[k] for k in parts),
                     "temp_bytes": e["temp_bytes"]})
    return rows


def compile_table(inspected: dict, times: dict) -> list:
    rows = []
    for e in inspected.values():
        rows.append({"source": "compile", "model": f"{e.get('model', 'mlp')} (item 4)", "strategy": e["strategy"],
                     "devices": e["devices"],
                     "lower_s": e["lower_s"], "compile_s": e["compile_s"]})
    for label, fws in times.items():
        for key, j in fws["jax"].items():
            t = fws["torch"][key]
            rows.append({"source": "first_step", "model": label, "strategy": j["strategy"], "devices": j["devices"],
                         "kernels": j.get("kernels", "mirrored"), "torch_path": path(t, "torch"),
                         "jax_first_step_s": j["first_step_s"], "torch_first_step_s": t["first_step_s"]})
    return rows
