"""Item 10 `jit_vs_hand`: each hand-written strategy (shard_map, its collectives written out) next to its -jit
form (plain `jax.jit` over NamedShardings, the partitioner's collectives) under both axis types, in one run on
the same model, N and batch: per accumulation, what the compiled step sends (bytes against the theory, and
the part that runs inside a loop: once per micro-batch), its peak bytes per device, and its median step time
(`jit_over_hand`: the -jit form's over the hand-written one's, measured in the same process)."""
from __future__ import annotations

from ... import train
from ...analysis import inspect
from ...core.run.config import JIT_STRATEGIES
from ...core.run.timing import timing
from .plan import jit_configs


def loop_bytes(r: dict) -> float:
    """Bytes per device per step of the collectives that run inside a loop (trips > 1)."""
    return sum(c["bytes_per_device"] * c["trips"] for c in r["collectives"] if (c["trips"] or 0) > 1)


def measure(cfg) -> dict:
    """One row: `cfg`'s compiled step read by `jaxdp inspect`, and `cfg` trained for its timing."""
    r = inspect.inspect(cfg)
    res = train.run(cfg, record=False, progress=False)
    return {"strategy": cfg.strategy, "axis_type": cfg.axis_type if cfg.strategy in JIT_STRATEGIES else None,
            "accum": cfg.accum, "devices": cfg.devices, "collectives": len(r["collectives"]),
            "ops": sorted({c["op"] for c in r["collectives"]}), "measured_bytes": r["bytes_per_device"],
            "theory_bytes": r["theory_bytes_per_device"], "loop_bytes": loop_bytes(r),
            "max_trips": max([c["trips"] or 1 for c in r["collectives"]], default=0),
            "peak_bytes": r["peak_bytes"], "state_bytes": r["state_bytes"],
            "step_s": timing(res.step_times)["median_step_s"], "loss_last": res.losses[-1]}


def jit_vs_hand(p, say) -> dict:
    """Every (hand-written, -jit) pair of the plan at N = the largest timed device count, per accumulation:
    the hand-written strategy, then its -jit form with `auto` and with `explicit`."""
    rows, hand_row = [], None
    for pair, cfg in jit_configs(p):
        hand = cfg.strategy not in JIT_STRATEGIES
        say(f"bench: {cfg.strategy}{'' if hand else ' ' + cfg.axis_type} at N={cfg.devices}, accum {cfg.accum}: "
            f"compiled and timed")
        row = {"pair": pair, **measure(cfg.validate("jax"))}
        hand_row = row if hand else hand_row
        row["jit_over_hand"] = row["step_s"] / hand_row["step_s"] if hand_row["step_s"] else None
        rows.append(row)
    return {"rows": rows}


def section(results: dict) -> list:
    """bench.md's table for item 10."""
    rows = results.get("jit_vs_hand", {}).get("rows", [])
    if not rows:
        return []
    lines = ["", "## 10. Hand-written (shard_map) vs -jit (the partitioner's), one run: bytes, loop, peak, time", "",
             "Bytes sent per device per step (compiled HLO) against the theory; `in loop`: the part inside a loop "
             "(once per micro-batch); peak bytes per device (`memory_analysis`); median step time on this CPU.", "",
             "| pair | strategy | axis type | accum | collectives (max trips) | KiB sent | theory KiB | KiB in loop "
             "| peak KiB | step ms | / hand-written |", "|---|---|---|---:|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['pair']} | {r['strategy']} | {r['axis_type'] or '-'} | {r['accum']} | {r['collectives']} "
                     f"({r['max_trips']}) | {r['measured_bytes'] / 1024:.1f} | {r['theory_bytes'] / 1024:.1f} | "
                     f"{r['loop_bytes'] / 1024:.1f} | {r['peak_bytes'] / 1024:.0f} | {1e3 * r['step_s']:.2f} | "
                     f"{r['jit_over_hand']:.2f} |")
    return lines


if __name__ == "__main__":  # item 10 alone: python -m jaxdp.harness.bench.jit [--quick] [--out DIR]
    import argparse
    import os
    import sys

    from ... import devices
    from ...core.files import atomic
    from .plan import plan

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="ddp / ddp-jit only, N = 2, accum 2, a small mlp")
    parser.add_argument("--out", default="reports/bench", help="folder for jit.json and jit.md")
    args = parser.parse_args()
    p = plan(args.quick)
    devices.setup(max(p.time_ns), "cpu")
    result = {"jit_vs_hand": jit_vs_hand(p, lambda m: print(m, file=sys.stderr, flush=True))}
    table = "\n".join(section(result)) + "\n"
    with atomic.staged(args.out) as stage:  # new files renamed in: a link there is replaced, not written through
        atomic.write_json(os.path.join(stage, "jit.json"), result, indent=1)
        atomic.write_text(os.path.join(stage, "jit.md"), table)
    print(table)
