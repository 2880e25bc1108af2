"""`jaxdp memory --target`: each strategy's compiled peak on the target GPU, beside the ZeRO formula.

One row per strategy (a contract: docs/GPU.md): `strategy`, `devices`, `nodes`, `target`, `peak_bytes` (the
compiled program's, `accounting.step_memory`: arguments + temporaries + outputs not aliased to donated
arguments), `state_bytes`, `temp_bytes`, `device_memory_bytes` (the target's), `fits` (peak within it), `psi`,
`k_bytes`, `param_bytes` and `formula` (params, grads, optimizer state per device, `accounting.formula_for`)
with its sum `formula_bytes`, `attention` and `fused_attention` (`gpu_program`'s: the attention compiled, its
cuDNN calls) and, where --kernels fused got XLA's attention, `attention_note`. Compiled from shapes
(`aot.TargetStep`): nothing is allocated; once per shape (`program_cache`: a shape compiled before, by any
command, is read back).
"""
from __future__ import annotations

from ..core.files import atomic
from ..core.memory import sizes
from ..core.run import targets
from . import accounting, aot


def row(cfg, target: str, nodes: int) -> dict:
    from . import inspect, program_cache

    mem, _, _ = program_cache.compiled(cfg, target, nodes, inspect._read_target)  # one entry: inspect's
    _, problem, optimizer, _ = aot.abstract_problem(cfg)
    f = accounting.formula_for(cfg, problem, optimizer)
    limit = targets.TARGETS[target].memory_bytes
    return {"strategy": cfg.strategy, "devices": cfg.devices, "nodes": nodes, "target": target,
            "peak_bytes": mem["peak_bytes"], "state_bytes": mem["state_bytes"], "temp_bytes": mem["temp_bytes"],
            "device_memory_bytes": limit, "fits": mem["peak_bytes"] <= limit, "psi": f["psi"],
            "k_bytes": f["k_bytes"], "param_bytes": f["param_bytes"], "formula": f["formula"],
            "formula_bytes": sum(f["formula"].values()), "compile_s": mem["target"]["compile_s"],
            "attention": mem["attention"], "fused_attention": mem["fused_attention"]
            } | ({"attention_note": mem["attention_note"]} if mem.get("attention_note") else {})


def format_rows(rows: list[dict]) -> str:
    lines = [f"{'strategy':<10} {'N':>3} {'peak (compiled)':>16} {'formula p+g+o':>14} {'temp':>10} "
             f"{'GPU memory':>11}  fits"]
    lines += [f"{r['strategy']:<10} {r['devices']:>3} {sizes.human(r['peak_bytes']):>16} "
              f"{sizes.human(r['formula_bytes']):>14} {sizes.human(r['temp_bytes']):>10} "
              f"{sizes.human(r['device_memory_bytes']):>11}  {'yes' if r['fits'] else 'NO'}" for r in rows]
    return "\n".join(lines)


def main(cfgs, target: str, nodes: int, json_path: str | None = None) -> int:
    for cfg in cfgs:  # every strategy checked before the first compile
        aot.check(cfg)
    rows = [row(cfg, target, nodes) for cfg in cfgs]
    base = cfgs[0]
    print(f"bytes per {target.upper()}, {base.model} (Psi = {rows[0]['psi']} parameters), {base.optimizer}, "
          f"{base.dtype}, N = {base.devices} on {nodes} node(s); peak compiled by XLA:GPU from shapes, formula "
          f"the ZeRO paper's")
    print(format_rows(rows))
    for note in dict.fromkeys(r["attention_note"] for r in rows if "attention_note" in r):
        print(f"note: {note}")
    if json_path:
        atomic.write_json(json_path, rows, indent=1)
        print(f"wrote {json_path}")
    return 0
