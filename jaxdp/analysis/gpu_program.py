"""`jaxdp inspect --target`: the GPU program read as the CPU one is, plus what only its schedule shows.

Added to `inspect`'s contract (docs/GPU.md): top-level `target` (name, description, devices, nodes,
gpus_per_node, device_memory_bytes, lower_s, compile_s) and `fits` (the compiled peak within the GPU's
memory); per collective `async`, `overlap_ops`, `overlap_flops` (`schedule.overlap`); `step_flops` (the
step's matrix-product FLOPs per device), `overlap_flops` (those run while a collective is in flight, x
trips), `collectives_in_loop` (collectives whose trips > 1: inside the accumulation loop), for the
strategies that gather parameters `prefetch` (an all-gather with compute scheduled under it: the next
unit gathered while this one computes); `combined` (collectives carrying several arrays: XLA:GPU's
combiners merged them) and `bytes_by_kind` against `theory_by_kind`, with `difference` saying where the
program's bytes leave the theory and why; per collective `inter_node` (a group spanning nodes: over
InfiniBand); `projection` (`projection.project`: a projected step time and MFU, labelled as such); `attention`
(the attention compiled: "mirrored", "cudnn" or "xla", `aot.attention_for`), `fused_attention` (cuDNN's fused
attention custom calls in the program text, forward and backward each one instruction per layer, a loop body's
counted once), `fused_attention_calls` ({"forward", "backward"}) and, where --kernels fused got XLA's attention,
`attention_note` (why).
"""
from __future__ import annotations

import math

import jax

from ..core.config import JIT_STRATEGIES
from ..core.registry import strategies as registry
from . import accounting, calibration, hlo, kernels, projection, schedule

GATHERS_PARAMS = tuple(e.name for e in registry.ENTRIES if e.jax and e.shards[0])  # zero3, hsdp, fsdp-jit
SYNC = {"async": False, "overlap_ops": 0, "overlap_flops": 0.0}
COMBINER_FLAGS = ("xla_gpu_all_reduce_combine_threshold_bytes, xla_gpu_all_gather_combine_threshold_bytes, "
                  "xla_gpu_reduce_scatter_combine_threshold_bytes")

DP_FIRST_HOP = ("XLA:GPU moved the bf16 gradients' widening to fp32 after the first hop of dp's reduce tree: the "
                "N/2 leaf devices send their own gradients in bf16 (a collective-permute of dtype bf16 here; exact, "
                "as the widening is), the later hops' fp32 sums stay fp32, while the theory counts fp32 on every "
                "hop: 1 byte per such parameter per device less (an fp32-accumulated gradient, as GPT-2's tied "
                "embedding's, stays fp32)")

ZERO3_BF16_GATHER = ("XLA:GPU moved the bf16 cast before the gathers that feed bf16 compute only: every forward "
                     "gather (and a few backward re-gathers, as Llama's embedding table's) is bf16 (all-gathers of "
                     "dtype bf16 here, half the bytes), the other re-gathers fp32, where the theory counts fp32 on "
                     "all; in float32 the bytes = theory")


def _sends_bf16(r: dict, op: str) -> bool:
    return any(c["op"] == op and "bf16" in c["dtype"] for c in r["collectives"])  # "bf16", "f32+bf16", "bf16>f32"


def describe(out: dict, step) -> dict:
    """`inspect`'s dictionary `out` of the target step `step` (`aot.TargetStep`), with the target's keys."""
    cfg, text = step.cfg, step.program.as_text()
    overlap = schedule.overlap(text)
    found = hlo.collectives_in_order(text, cfg.devices)
    per_node = cfg.devices // step.nodes
    for op, c in zip(out["collectives"], found, strict=True):
        op.update(overlap.get(c["name"], SYNC))
        op["arrays"] = c["arrays"]
        op["nodes"] = max((len({d // per_node for d in g}) for g in c["groups"]), default=1)
        op["inter_node"] = op["nodes"] > 1
    t = step.target
    out["target"] = {"name": t.name, "description": t.description, "devices": cfg.devices, "nodes": step.nodes,
                     "gpus_per_node": cfg.devices // step.nodes, "device_memory_bytes": t.memory_bytes,
                     "lower_s": round(step.lower_s, 2), "compile_s": round(step.compile_s, 2)}
    out["fits"] = out["peak_bytes"] <= t.memory_bytes
    ops = out["collectives"]
    out["step_flops"] = schedule.total_flops(text)
    out["attention"], out["fused_attention_calls"] = step.attention, step.fused_calls
    out["fused_attention"] = sum(step.fused_calls.values())
    if step.attention_note:
        out["attention_note"] = step.attention_note
    out["overlap_flops"] = sum(c["overlap_flops"] * (c["trips"] or 1) for c in ops)
    out["collectives_in_loop"] = sum(1 for c in ops if (c["trips"] or 0) > 1)
    if cfg.strategy in GATHERS_PARAMS:
        out["prefetch"] = any(c["op"] == "all-gather" and c["overlap_flops"] > 0 for c in ops)
    out["combined"] = sum(1 for c in ops if c["arrays"] > 1)
    out["copies"] = copies(text)
    out["bytes_by_kind"], out["theory_by_kind"] = _by_kind(ops), _theory(cfg, step)
    out["difference"] = difference(out)
    psi = sum(int(math.prod(p.shape)) for p in jax.tree.leaves(step.problem.params))
    step.kernels = kernels.read(text)
    roofline = projection.project(out, t, text, psi, cfg)
    out["projection"] = calibration.for_target(out, t, step.kernels, roofline, cfg)
    return out


def copies(text: str) -> dict:
    """The step's own `copy` kernels (the entry computation's): values XLA wrote to a fresh buffer and then copied
    into their output's, where it could not compute them in place (docs/GPU.md, ddp-ring's peak)."""
    entry, comps = hlo.computations(text)
    found = [shape for _, shape, op, _ in schedule.defs(comps[entry]) if op == "copy"]
    return {"count": len(found), "bytes": sum(hlo.DTYPE_BYTES[d] * e for s in found for d, e in hlo.arrays_of(s))}


def _by_kind(ops: list[dict]) -> dict:
    kinds = {kind: 0.0 for kind in accounting.KINDS.values()}
    for c in ops:
        kind = accounting.KINDS.get(c["op"], c["op"])
        kinds[kind] = kinds.get(kind, 0.0) + c["bytes_per_device"] * (c["trips"] or 1)
    return kinds


def _theory(cfg, step) -> dict:
    shapes = [tuple(p.shape) for p in jax.tree.leaves(step.problem.params)]
    out = accounting.theory_for(cfg, [math.prod(s) for s in shapes], accounting.root_sizes(step.problem), 0, shapes)
    return {k: v for k, v in out.items() if k != "total"}


def difference(r: dict) -> str:
    """Where the GPU program's bytes differ from the theory, by kind, and the reason that applies."""
    off = [k for k, v in r["bytes_by_kind"].items()
           if abs(v - r["theory_by_kind"].get(k, 0.0)) > 1e-6 * max(1.0, r["theory_bytes_per_device"])]
    merged = (f"; XLA:GPU's combiners merged arrays into {r['combined']} collective(s) (bytes unchanged, fewer "
              f"launches; thresholds: {COMBINER_FLAGS})") if r["combined"] else ""
    if not off:
        return "bytes = theory" + merged
    parts = ", ".join(f"{k} {r['bytes_by_kind'][k]:.0f} (theory {r['theory_by_kind'].get(k, 0.0):.0f})" for k in off)
    why = ""
    row = registry.entry(r["strategy"])
    if row.comm == "zero" and row.shards[0] and _sends_bf16(r, "all-gather"):  # zero3, hsdp
        why = ZERO3_BF16_GATHER + ("; on each shard group" if row.grid else "")
    if row.comm == "tree" and _sends_bf16(r, "collective-permute"):  # dp
        why = DP_FIRST_HOP
    if r["strategy"] in JIT_STRATEGIES:
        why = "the partitioner chose these collectives from the shardings (jit/layout.py's theory is its model)"
        if r["dtype"] == "bfloat16" and _sends_bf16(r, "all-gather"):
            why += ("; it moved the bf16 cast before the gathers (all-gathers of dtype bf16 here: the same values, "
                    "half the bytes), where the theory counts the fp32 master weights")
        if r["dtype"] == "bfloat16" and any(_sends_bf16(r, op) for op in ("all-reduce", "reduce-scatter")):
            why += "; it reduces gradients in bf16 (reductions of dtype bf16 here: a bug, docs/STRATEGIES.md)"
    why = why or "not explained here: compare the collectives with `jaxdp inspect` without --target"
    return f"differs: {parts}: {why}" + merged


def format_target(r: dict) -> str:
    t = r["target"]
    lines = [f"target: {t['devices']} x {t['description']} on {t['nodes']} node(s) of {t['gpus_per_node']} "
             f"(compiled in {t['compile_s']:.1f} s; no kernel ran): peak {r['peak_bytes']} of "
             f"{t['device_memory_bytes']} bytes: {'fits' if r['fits'] else 'DOES NOT FIT'}",
             f"  {'#':>3} {'op':<19} {'async':>5} {'overlap ops':>11} {'overlap FLOPs':>14}"]
    lines += [f"  {i:>3} {c['op']:<19} {'yes' if c['async'] else 'no':>5} {c['overlap_ops']:>11} "
              f"{c['overlap_flops']:>14.3g}" for i, c in enumerate(r["collectives"])]
    share = r["overlap_flops"] / r["step_flops"] if r["step_flops"] else 0.0
    lines.append(f"matrix FLOPs per device per step {r['step_flops']:.3g}, {r['overlap_flops']:.3g} ({share:.0%}) "
                 f"while a collective is in flight; collectives inside the accumulation loop: "
                 f"{r['collectives_in_loop']}")
    if "prefetch" in r:
        lines.append(f"prefetch (a unit's all-gather overlapping compute): {'yes' if r['prefetch'] else 'no'}"
                     + prefetch_note(r))
    lines.append(f"bytes against theory: {r['difference']}")
    if r["attention"] != "mirrored":
        calls = r["fused_attention_calls"]
        lines.append(f"attention: {r['attention']}, {r['fused_attention']} cuDNN fused attention calls "
                     f"({calls['forward']} forward, {calls['backward']} backward)")
    if "attention_note" in r:
        lines.append(f"note: {r['attention_note']}")
    if r["copies"]["count"]:
        lines.append(copies_note(r))
    lines.append(calibration.summary_line(r["projection"]))
    return "\n".join(lines)


def prefetch_note(r: dict) -> str:
    """Why no gather overlaps compute where XLA:GPU's combiner merged gathers (docs/GPU.md: measured on GPT-2 and
    Llama with its threshold flipped); empty otherwise."""
    if r.get("prefetch") is not False or not any(c["op"] == "all-gather" and c["arrays"] > 1 for c in r["collectives"]):
        return ""
    return (" (XLA:GPU's combiner merged gathers, and no merged gather runs under compute; a lower "
            "xla_gpu_all_gather_combine_threshold_bytes keeps them per array: docs/GPU.md)")


RING_COPIES = ("; ddp-ring: XLA:GPU fuses the pack, the chunk writes and the unpack into every kernel that reads a "
               "gradient after the ring, so the updates of many leaves share all their operands and become one "
               "multi-output kernel, whose outputs other than its reduction's cannot overwrite their inputs: the "
               "old and new state of those leaves are live together, with all N-1 received chunks and the bf16 "
               "gradients (docs/GPU.md: Llama 3 8B on 8 H100s, 558 copies, 69.7 GB of its 96.4 GB of state; peak "
               "184.5 GiB against ddp's 111.7)")


def copies_note(r: dict) -> str:
    """The step's copy kernels, in one line, with the reason where it is known (ddp-ring)."""
    c = r["copies"]
    return (f"copies: {c['count']} arrays ({c['bytes'] / 2**30:.3g} GiB) computed into fresh buffers and copied to "
            f"their outputs" + (RING_COPIES if registry.get(r["strategy"], "comm") == "ring" else ""))
