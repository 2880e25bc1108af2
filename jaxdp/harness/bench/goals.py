"""The issue's goals, one line each: met / not met / not measured, with the numbers behind it."""
from __future__ import annotations

from ...core.registry import strategies as registry

OVERHEAD_GOAL = {e.name: e.overhead_goal for e in registry.ENTRIES if e.overhead_goal}  # over single's step
RING_GOAL = 1.25
COLLECTIVE_GOAL = 1.5  # the hand-written ring all-reduce over psum, timed alone
MFU_GOAL = 0.45


def goals(results: dict) -> list:
    return [_step_time(results), _overhead(results), _ring(results), _communication(results), _memory(results),
            {"item": 6, "goal": "compilation time per strategy (reported, no target)", "met": None,
             "detail": "see the table"},
            _gpu(results), _collectives(results)]


def _step_time(results: dict) -> dict:
    st = [r for r in results["step_time"]["rows"] if r["jax_over_torch"] is not None]
    worst = max(st, key=lambda r: r["jax_over_torch"])
    return {"item": 1, "goal": "JAX at least as fast as torch for every strategy (JAX/torch <= 1)",
            "met": all(r["jax_over_torch"] <= 1.0 for r in st),
            "detail": f"worst {worst['jax_over_torch']:.2f}x ({worst['model']} {worst['strategy']} "
                      f"N={worst['devices']}{_path(worst)}); {sum(r['jax_over_torch'] <= 1.0 for r in st)}/{len(st)} "
                      "rows met"}


def _overhead(results: dict) -> dict:
    ov = [r for r in results["dp_overhead"]["rows"] if r["framework"] == "jax" and r["goal"] is not None]
    return {"item": 2, "goal": "ddp, zero1, zero2 at most 1.15x single (JAX)",
            "met": bool(ov) and all(r["met"] for r in ov),
            "detail": ", ".join(f"{r['model']} {r['strategy']}@{r['devices']}{_path(r)} {r['over_single']:.2f}x"
                                for r in ov)}


def _ring(results: dict) -> dict:
    rg = [r for r in results["ring_vs_xla"]["rows"] if r["framework"] == "jax"]
    return {"item": 3, "goal": "ddp-ring at most 1.25x ddp (JAX)", "met": bool(rg) and all(r["met"] for r in rg),
            "detail": ", ".join(f"{r['model']}@{r['devices']}{_path(r)} {r['ring_over_ddp']:.2f}x" for r in rg)}


def _path(row: dict) -> str:
    """A row's kernels path after its name, when it is not the mirrored reference."""
    return "" if row.get("kernels", "mirrored") == "mirrored" else f" {row['kernels']}"


def _communication(results: dict) -> dict:
    cm = results["communication"]["rows"]
    off = [r for r in cm if not r["equal_to_theory"]]
    differ = ", ".join(sorted({f"{r['strategy']} ({r['measured_over_theory']:.3f}x)" for r in off})) or "none"
    return {"item": 4, "goal": "HLO bytes per device equal to theory", "met": not off,
            "detail": f"{len(cm) - len(off)}/{len(cm)} equal; differ: {differ}"}


def _memory(results: dict) -> dict:
    mm = results["memory"]["rows"]
    return {"item": 5, "goal": "sharded state falls as 1/N (measured = ZeRO formula, exact padding)",
            "met": all(r["equal_to_formula"] for r in mm),
            "detail": f"{sum(r['equal_to_formula'] for r in mm)}/{len(mm)} rows equal to the formula"}


def _gpu(results: dict) -> dict:
    g = results["gpu_throughput"]
    goal = f"MFU >= {MFU_GOAL:.0%} on an H100 and jaxdp >= torch"
    if not g.get("measured"):
        return {"item": 7, "goal": goal, "met": None, "detail": g.get("reason", "not measured")}
    mfu = g["frameworks"]["jax"].get("mfu")
    over = g.get("jax_over_torch_tokens_per_s")
    return {"item": 7, "goal": goal,
            "met": bool(mfu is not None and mfu >= MFU_GOAL and over is not None and over >= 1.0),
            "detail": f"{g['device']}: JAX MFU {mfu if mfu is None else f'{mfu:.1%}'}, jaxdp/torch tokens/s "
                      f"{over if over is None else f'{over:.2f}'}"}


def _collectives(results: dict) -> dict:
    rows = results["collectives"]["rows"]
    ar = [r for r in rows if r["op"] == "all_reduce"]
    worst = {op: max((r for r in rows if r["op"] == op), key=lambda r: r["ratio"]) for op in {r["op"] for r in rows}}
    return {"item": 8, "goal": f"ring all-reduce at most {COLLECTIVE_GOAL}x psum, timed alone (1-64 MB, N = 2, 4)",
            "met": bool(ar) and all(r["ratio"] <= COLLECTIVE_GOAL for r in ar),
            "detail": "; ".join(f"{op} worst {r['ratio']:.2f}x ({r['mb']:g} MB, N={r['devices']})"
                                for op, r in sorted(worst.items()))}
