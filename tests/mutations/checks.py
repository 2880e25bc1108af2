"""The checks that read the program and the devices rather than the trace:

- `reduction_dtypes`: the element types of every collective in the compiled step (XLA's optimised
  HLO, `lower(...).compile().as_text()`): bf16 runs claim an fp32 gradient reduction, so every
  all-reduce / reduce-scatter / all-to-all must carry f32, never bf16 (and the hand-written strategies'
  gathers and ring sends too; a -jit partitioner may gather parameters already cast to bf16: exact);
- `replica_mismatches`: after each step, every device's copy of each replicated array of the train
  state (parameters, optimizer state) must be bitwise identical to the others' (read from the
  addressable shards), since the strategies that run with replication unchecked (`check_vma=False`)
  would keep diverged copies silently; and finite.
"""
from __future__ import annotations

import re

import jax
import numpy as np

from jaxdp.analysis import accounting, hlo
from jaxdp.core.run import data

FLOATS = ("bf16", "f16", "f32", "f64")
MOVERS = ("all-gather", "collective-permute")
_DEF = re.compile(r"\s*(?:ROOT )?%([\w.\-]+) = ")
_COMPUTATION = re.compile(r"^(?:ENTRY )?%([\w.\-]+) .*\{\s*$")
_NARROW = re.compile(r"= bf16\[[^\]]*\]\S* convert\(")
# dp's optimizer state is kept (and true) on device 0 only, by design: its other copies are stale.
NOT_REPLICATED = {"dp": ("opt_state",)}


def reduction_dtypes(hlo_text: str) -> dict[str, set[str]]:
    """{collective op: the float element types it carries} in a compiled HLO module's text, read from each
    collective's own type (`hlo.collective`), with XLA:CPU's widening undone:
    - a reduction (all-reduce, reduce-scatter) counts bf16 where XLA:CPU reduced arrays of it widened
      from bf16 (`widened`, jaxdp/analysis/widened.py: convert -> f32 reduction -> convert back): the
      partitioned program reduced them in bf16. An honest fp32 reduction of values each device computed
      in bf16 (its own gradient, converted by the cast's transpose) is f32: the sum is what must be fp32;
    - a data mover (all-gather, collective-permute) counts bf16 where its operand was rounded to bf16 just
      before (a convert to bf16 in the instruction, or the fusion, that produces it): XLA:CPU's float
      normalisation runs a bf16 gather as convert -> f32 gather, and the values sent are bf16 either way;
    - all-to-all (the -jit explicit form's gradient trade): its own type."""
    lines = hlo_text.splitlines()
    defs = {m.group(1): line for line in lines if (m := _DEF.match(line))}
    bodies, current = {}, None
    for line in lines:
        if (m := _COMPUTATION.match(line)):
            current = bodies.setdefault(m.group(1), [])
        elif current is not None:
            current.append(line)
    found: dict[str, set[str]] = {}
    for c in hlo.collectives_in_order(hlo_text, 1):
        kinds = found.setdefault(c["op"], set())
        kinds.update(d for d in c["array_dtypes"] if d in FLOATS)
        if c["widened"]:
            kinds.add("bf16")
        line = defs.get(c["name"].split()[-1].lstrip("%"), "")
        args = (re.split(rf" {c['op']}(?:-start)?\(", line, maxsplit=1) + [""])[1].split(")")[0]
        if c["op"] in MOVERS and any(_rounded_to_bf16(n, defs, bodies) for n in re.findall(r"%([\w.\-]+)", args)):
            kinds.add("bf16")
    return found


def _rounded_to_bf16(name: str, defs: dict, bodies: dict, depth: int = 3) -> bool:
    """Whether the value `name` was produced by narrowing to bf16 (directly, or inside the fusion that
    computes it), looking through a few layout-only instructions."""
    line = defs.get(name, "")
    if _NARROW.search(line):
        return True
    if (called := re.search(r"calls=%([\w.\-]+)", line)) and " fusion(" in line:
        return any(_NARROW.search(body) for body in bodies.get(called.group(1), []))
    if depth and (m := re.search(r" (?:bitcast|copy|reshape|get-tuple-element)\(%([\w.\-]+)", line)):
        return _rounded_to_bf16(m.group(1), defs, bodies, depth - 1)
    return False


def compiled_step(cfg):
    """`cfg`'s step compiled (`accounting.compile_step`), its HLO's collective dtypes, and the pieces
    to run it: (CompiledStep, {op: dtypes})."""
    c = accounting.compile_step(cfg)
    return c, reduction_dtypes(c.program.as_text())


def replica_mismatches(cfg, steps: int = 2, compiled=None) -> list[str]:
    """Train `steps` steps of `cfg` with its compiled step and name every state array whose copies
    differ between devices (or hold NaN/Inf) after any step; [] when every replica agrees bit for bit."""
    c = compiled or accounting.compile_step(cfg)
    dataset = data.load(cfg.data, cfg.seed, cfg.seq_len)
    state, batch, out = c.state, c.batch, []
    for k in range(1, steps + 1):
        if k > 1:
            batch = c.strategy.put_batch(*accounting.step_batch(cfg, c.strategy, dataset, k))  # the one layout
        state, _ = c.program(state, *batch)
        out += [f"step {k}: {what}" for what in differing(state, cfg.strategy)]
    return out


def differing(state, strategy: str) -> list[str]:
    """The state arrays whose same-index shards (replicas) are not bitwise identical, or non-finite.
    ddp-pmap stacks one copy per device along a leading axis: there the copies are its rows."""
    out = []
    skip = NOT_REPLICATED.get(strategy, ())
    for path, leaf in jax.tree.flatten_with_path(state._asdict())[0]:
        name = jax.tree_util.keystr(path)
        if any(name.startswith(f"['{s}']") for s in skip) or not hasattr(leaf, "addressable_shards"):
            continue
        copies: dict[str, list[np.ndarray]] = {}
        for shard in leaf.addressable_shards:
            key = "all" if strategy == "ddp-pmap" else str(shard.index)
            copies.setdefault(key, []).append(np.asarray(shard.data))
        for group in copies.values():
            if any(a.tobytes() != group[0].tobytes() for a in group[1:]):
                out.append(f"{name}: copies differ between devices")
                break
        if np.asarray(leaf.addressable_shards[0].data).dtype.kind == "f" and not all(
                np.isfinite(np.asarray(s.data)).all() for s in leaf.addressable_shards):
            out.append(f"{name}: NaN or Inf")
    return out
