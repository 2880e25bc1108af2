"""What a scheduled GPU program overlaps: each collective's start/done pair and the work between them.

XLA:GPU turns a collective into `<op>-start` and `<op>-done` (or `async-start` / `async-done` around a
computation holding it) and its latency-hiding scheduler moves independent instructions between the two:
those run while the collective is in flight. For each collective (by its start's name) `overlap` gives
`async` (a start/done pair that XLA did not mark `"is_sync":true`: a pair with nothing to hide behind is
run synchronously), `overlap_ops` (the instructions scheduled between start and done, less the free ones:
tuple plumbing, bitcasts, constants) and `overlap_flops` (their matrix-product FLOPs: 2 x the output's
elements x the contracted size of each `dot` they run, through fusions, calls and loops, a loop body
counted once per known trip), those of the GEMMs XLA:GPU hands to cuBLAS as custom calls (`__cublas$gemm`,
`__cublas$lt$matmul`: a dot by its backend config's dimension numbers) and those of cuDNN's fused attention custom
calls (`fmha_flops`). Elementwise work is not counted: the FLOPs are the tensor-core ones.
"""
from __future__ import annotations

import math
import re

from . import hlo

FREE = ("get-tuple-element", "bitcast", "tuple", "constant", "parameter", "copy-start", "copy-done")
_DEF = re.compile(r"^\s*(?:ROOT )?%(?P<name>[^\s=]+) = (?P<shape>.+?) (?P<op>[a-z][\w-]*)\(")
_DIMS = re.compile(r"\[([\d,]*)\]")
FMHA = "__cudnn$fmha"  # cuDNN's fused attention custom calls: __cudnn$fmhaSoftmax, ...Backward, ...F8
_TARGET = re.compile(r'custom_call_target="([^"]+)"')
_SCORES = re.compile(r'"intermediate_tensor_shape":\s*\{"element_type":\s*"\w+",\s*"dimensions":\s*\[([^\]]*)\]')
_CONSTRAINTS = re.compile(r"operand_layout_constraints=\{(.*?)\}, (?:api_version|metadata|backend_config)")
_ASYNC = re.compile(r"(?P<op>" + "|".join(hlo.OPS) + r"|async)-(?P<end>start|done)\((?P<args>[^)]*)\)")


def _dims(shape: str) -> list[int]:
    m = _DIMS.search(shape)
    return [int(d) for d in m.group(1).split(",") if d] if m else []


def defs(lines: list[str]) -> list[tuple[str, str, str, str]]:
    """(name, result shape, opcode, line) of each instruction, in schedule order."""
    out = []
    for line in lines:
        m = _DEF.match(line)
        if m:
            out.append((m.group("name"), m.group("shape"), m.group("op"), line))
    return out


def _dot_flops(line: str, shape: str, shapes: dict[str, str], op: str = "dot") -> float:
    """2 x the (first) result's elements x the contracted size: a `dot`'s, or a cuBLAS GEMM custom call's (its
    contracting dimensions in its backend config's `dot_dimension_numbers`)."""
    operands = re.findall(r"%([^\s,)]+)", line.split(f" {op}(", 1)[1].split(")", 1)[0])
    m = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", line) if op == "dot" else \
        re.search(r'"lhs_contracting_dimensions":\s*\[([^\]]*)\]', line)
    lhs = _dims(shapes.get(operands[0], "")) if operands else []
    contracted = math.prod(lhs[int(c.strip('" '))] for c in m.group(1).split(",") if c.strip()) if m and lhs else 0
    return 2.0 * math.prod(_dims(shape)) * contracted


def fmha_target(line: str) -> str | None:
    """The cuDNN fused attention custom call's target a line holds (None for any other instruction)."""
    m = _TARGET.search(line)
    return m.group(1) if m and m.group(1).startswith(FMHA) else None


def fmha_calls(hlo_text: str) -> dict[str, int]:
    """The cuDNN fused attention custom calls of a compiled program, as its text has them (an instruction inside a
    loop body counted once): {"forward": n, "backward": m}."""
    found = {"forward": 0, "backward": 0}
    for line in hlo_text.splitlines():
        if " custom-call(" in line and (target := fmha_target(line)):
            found["backward" if "Backward" in target else "forward"] += 1
    return found


def _pairs(t: int, s: int, window: int, causal: bool) -> float:
    """The (query, key) pairs a causal mask (and a sliding window) leaves of t x s: what cuDNN computes."""
    if not causal:
        return float(t * s)
    cap = min(s, window) if window > 0 else s  # query i sees min(i + 1, cap) keys
    return float(t * (t + 1) // 2 if t <= cap else cap * (cap + 1) // 2 + (t - cap) * cap)


def fmha_flops(line: str) -> float:
    """Matrix FLOPs of one cuDNN fused attention call, from its backend config's scores shape [b, h, t, s] and its
    q and v operands' head dims d, dv (their last dimension in either layout): the forward's Q K^T and P V,
    2 b h (d + dv) per pair; the backward's recomputed Q K^T, then dV, dP, dQ, dK: 2 b h (3 d + 2 dv) per pair.
    A causal mask counts the pairs of its lower triangle, t (t + 1) / 2 for t = s (cuDNN skips the masked
    blocks; the blocks on the diagonal, computed whole, are not modelled)."""
    scores, constraints = _SCORES.search(line), _CONSTRAINTS.search(line)
    if not scores or not constraints:
        return 0.0
    b, h, t, s = (int(x.strip('" ')) for x in scores.group(1).split(","))
    operands = _DIMS.findall(constraints.group(1))
    d, dv = int(operands[0].split(",")[-1]), int(operands[2].split(",")[-1])
    window, mask = re.search(r'"sliding_window_length":\s*(\d+)', line), re.search(r'"mask_type":\s*"(\w+)"', line)
    pairs = _pairs(t, s, int(window.group(1)) if window else 0, bool(mask) and "CAUSAL" in mask.group(1))
    per_pair = 3 * d + 2 * dv if "Backward" in (fmha_target(line) or "") else d + dv
    return 2.0 * b * h * pairs * per_pair


class Flops:
    """Matrix-product FLOPs of each computation of a module (memoised), callees included."""

    def __init__(self, comps: dict[str, list[str]]):
        self.comps, self.memo = comps, {}

    def of_computation(self, name: str, depth: int = 0) -> float:
        if name not in self.memo:
            found = defs(self.comps.get(name, []))
            shapes = {n: s for n, s, _, _ in found}
            self.memo[name] = 0.0  # a cycle (none in HLO) would count nothing
            self.memo[name] = sum(self.of_line(op, shape, line, shapes, depth) for _, shape, op, line in found)
        return self.memo[name]

    def of_line(self, op: str, shape: str, line: str, shapes: dict[str, str], depth: int = 0) -> float:
        if op == "dot":
            return _dot_flops(line, shape, shapes)
        if op == "custom-call" and fmha_target(line):
            return fmha_flops(line)
        if op == "custom-call" and 'custom_call_target="__cublas$' in line:
            return _dot_flops(line, shape, shapes, op)
        if depth > 32 or op.endswith("-done") or op == "async-update":
            return 0.0
        total = 0.0
        trips = hlo.trip_count(line) if op == "while" else 1
        for attr, value in re.findall(r"\b(body|calls|branch_computations|to_apply)=(\{[^}]*\}|%[^\s,)]+)", line):
            if attr == "to_apply":
                continue
            factor = (trips or 1) if attr == "body" else 1
            total += factor * sum(self.of_computation(c, depth + 1) for c in re.findall(r"%([^\s,}]+)", value))
        return total


def _inner_collectives(line: str, comps: dict[str, list[str]]) -> list[str]:
    """The collectives an `async-start` wraps (the names of their instructions in its computation)."""
    names = []
    for value in re.findall(r"\bcalls=(%[^\s,)]+)", line):
        for inner in comps.get(value.lstrip("%"), []):
            m = _DEF.match(inner)
            if m and m.group("op") in hlo.OPS:
                names.append(m.group("name"))
    return names


def overlap(hlo_text: str) -> dict[str, dict]:
    """{a collective's start name (or the wrapped collective's name): {async, overlap_ops, overlap_flops}}."""
    _, comps = hlo.computations(hlo_text)
    flops, out = Flops(comps), {}
    for lines in comps.values():
        found = defs(lines)
        shapes = {n: s for n, s, _, _ in found}
        for i, (name, _, op, line) in enumerate(found):
            if not (op.endswith("-start") and (op[:-6] in hlo.OPS or op == "async-start")):
                continue
            keys = [name] if op != "async-start" else _inner_collectives(line, comps)
            if not keys:
                continue
            done = next((j for j in range(i + 1, len(found)) if found[j][2].endswith("-done")
                         and re.search(r"\(%" + re.escape(name) + r"\)", found[j][3])), None)
            between = found[i + 1:done] if done is not None else []
            work = [(o, s, ln) for _, s, o, ln in between if o not in FREE]
            info = {"async": done is not None and '"is_sync":true' not in line, "overlap_ops": len(work),
                    "overlap_flops": sum(flops.of_line(o, s, ln, shapes) for o, s, ln in work)}
            out.update({k: info for k in keys})
    return out


def total_flops(hlo_text: str) -> float:
    """The entry computation's matrix-product FLOPs (per device: the program is one device's)."""
    entry, comps = hlo.computations(hlo_text)
    return Flops(comps).of_computation(entry)
