"""The compiled GPU program's kernels by kind: what the calibrated projection (`calibration`) prices one by one.

Each instruction of the entry computation, and of the loops it runs (times their trips), that launches work on
the GPU is one kernel of one kind:
- `gemm`: a matrix product (an unfused `dot`, a fusion XLA:GPU lowers to a GEMM: `__triton_gemm`,
  `__triton_nested_gemm_fusion`, `__cublas` ..., or any fusion whose computation holds a `dot`);
- `attention`: a cuDNN fused-attention custom call (`__cudnn$fmha...`);
- `copy`: a `copy` (or `copy-start`): a buffer written to another;
- `fusion`: everything else that moves data: XLA's loop, input and Triton (softmax, normalisation) fusions,
  unfused reductions, transposes, scatters: memory-bound kernels;
- collectives are not kernels here (the network model prices them: `network`), nor tuple plumbing, bitcasts,
  constants and parameters.
For each kernel its runs per step, `flops` (their matrix-product FLOPs: `schedule.Flops`; an attention
custom call's its own, `attention_flops`) and `bytes` (their HBM traffic: `projection._kernel`, as the uncalibrated
roofline counts it); `by_kind` sums them per kind.
"""
from __future__ import annotations

import math
import re

from . import hlo, projection, schedule

KINDS = ("gemm", "attention", "fusion", "copy")
GEMM_BACKENDS = ("__triton_gemm", "__triton_nested_gemm_fusion", "__cublas", "cublas")
_BACKEND = re.compile(r'"kind":"([^"]+)"')
_TARGET = re.compile(r'custom_call_target="([^"]+)"')


def kind_of(op: str, line: str, comps: dict) -> str | None:
    """The kind of the kernel `line` launches (None: no kernel, or a collective)."""
    if op in projection.KERNEL_FREE or op.endswith("-done") or op in hlo.OPS or op.endswith("-update"):
        return None
    if op.endswith("-start") and op[:-6] in hlo.OPS or op == "async-start":
        return None
    if op in ("copy", "copy-start"):
        return "copy"
    if op == "dot":
        return "gemm"
    if op == "custom-call":
        target = (_TARGET.search(line) or [None, ""])[1]
        if "fmha" in target or "cudnn$" in target:
            return "attention"
        return "gemm" if any(b in target for b in GEMM_BACKENDS) else "fusion"
    if op == "fusion":
        backend = _BACKEND.search(line)
        if backend and any(backend.group(1).startswith(b) for b in GEMM_BACKENDS):
            return "gemm"
        called = hlo.CALLS.search(line)
        body = comps.get(called.group(2).lstrip("%"), []) if called else []
        if any(" dot(" in b for b in body):
            return "gemm"
    return "fusion"


def attention_flops(line: str, shapes: dict[str, str]) -> float:
    """A cuDNN attention call's matrix-product FLOPs from its operands (q, k, v as [batch, heads, seq, dim] or
    [batch, seq, heads, dim]): 4 b h s_q s_k d forward (QK^T and PV), 2.5x that for the backward (dQ, dK, dV
    and the recomputed scores), halved when causal (the masked blocks are skipped)."""
    args = line.split("custom-call(", 1)[1].split(")", 1)[0] if "custom-call(" in line else ""
    names = re.findall(r"%([^\s,)]+)", args)
    dims = [schedule._dims(shapes.get(n, "")) for n in names[:2]]
    if len(dims) < 2 or len(dims[0]) != 4 or len(dims[1]) != 4:
        return 0.0
    q, k = dims
    flops = 4.0 * math.prod(q) * max(k[1], k[2])  # the sequence is the longer of the two middle axes
    flops *= 2.5 if "Backward" in line else 1.0
    return flops / 2 if "causal" in line.lower() or "mask_type\":\"CAUSAL" in line else flops


def read(hlo_text: str) -> list[list]:
    """[kind, runs per step, FLOPs, bytes] of each kernel of one step of the program (see the module docstring)."""
    entry, comps = hlo.computations(hlo_text)
    flops, fused, out = schedule.Flops(comps), {}, []

    def walk(name: str, trips: float, depth: int) -> None:
        if depth > 32:
            return
        defs = schedule.defs(comps.get(name, []))
        shapes = {n: s for n, s, _, _ in defs}
        for _, shape, op, line in defs:
            if op == "while":
                body = [b for a, b in hlo.CALLS.findall(line) if a == "body"]
                for b in body:
                    walk(b.lstrip("%"), trips * (hlo.trip_count(line) or 1), depth + 1)
                continue
            kind = kind_of(op, line, comps)
            if kind is None:
                continue
            work = flops.of_line(op, shape, line, shapes)
            if kind == "attention" and not work:  # a custom call's FLOPs where the schedule's reader has none
                work = attention_flops(line, shapes)
            out.append([kind, trips, work, projection._kernel(op, shape, line, shapes, comps, fused)])

    walk(entry, 1.0, 0)
    return out


def by_kind(found: list[list]) -> dict[str, dict[str, float]]:
    """{kind: {count, flops, bytes}}: `read`'s kernels summed per kind (x their runs per step)."""
    out = {k: {"count": 0.0, "flops": 0.0, "bytes": 0.0} for k in KINDS}
    for kind, trips, work, moved in found:
        row = out[kind]
        row["count"] += trips
        row["flops"] += trips * work
        row["bytes"] += trips * moved
    return out
