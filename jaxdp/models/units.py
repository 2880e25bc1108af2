"""FSDP units: the pieces of a model that `zero3` gathers, runs and frees one at a time.

A model lists its units in forward order (`unit_specs()`) and its `__call__` is the fold of those
units (`run`), so running the units one by one *is* the model, operation for operation. A unit owns
one or more parameter subtrees: an MLP layer; a transformer block; the two embeddings together; the
final LayerNorm with the head. torch_ref wraps the same groups with `fully_shard`.

`pure_units` turns the specs into pure functions of (the unit's parameter subtrees, x), which is
what a strategy sees; `split` and `join` move between a parameter tree and its per-unit parts.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from flax import nnx

from ..core.errors import ConfigError


class UnitSpec(NamedTuple):
    name: str                   # e.g. 'layers/0', 'embed', 'blocks/1', 'head'
    paths: tuple[tuple, ...]    # the parameter subtrees it owns, as key paths: (('layers', 0),)
    forward: Callable           # (*submodules at `paths`, x) -> x


class Unit(NamedTuple):
    name: str
    paths: tuple[tuple, ...]
    apply: Callable             # (tuple of parameter subtrees at `paths`, x) -> x


def at(node, path):
    """The submodule (or parameter subtree) at `path`: attributes by name, list items by index."""
    for key in path:
        node = node[key] if isinstance(key, int) or isinstance(node, dict) else getattr(node, key)
    return node


def run(model, x):
    """The model's forward: its units in order."""
    for spec in model.unit_specs():
        x = spec.forward(*(at(model, p) for p in spec.paths), x)
    return x


def parted(module) -> tuple:
    """(graphdef, its non-parameter variables as a pure dict: fresh variables at every merge)."""
    graphdef, _, rest = nnx.split(module, nnx.Param, ...)
    return graphdef, nnx.to_pure_dict(rest)


def pure_units(model) -> tuple[Unit, ...]:
    """The model's units as pure functions of their parameter subtrees (nested dicts, as in
    `nnx.to_pure_dict`)."""
    units = []
    for spec in model.unit_specs():
        # (graphdef, the other variables): BatchNorm's running statistics (`nnx.BatchStat`) are held at
        # their current values, as `models.from_module`'s `apply` holds them (the loss does not read them)
        splits = tuple(parted(at(model, p)) for p in spec.paths)

        def apply(params, x, splits=splits, forward=spec.forward):
            return forward(*(nnx.merge(g, p, rest) for (g, rest), p in zip(splits, params, strict=True)), x)

        units.append(Unit(spec.name, spec.paths, apply))
    return tuple(units)


def shared_paths(units) -> tuple[tuple, ...]:
    """Parameter subtrees listed by more than one unit (a tied weight: GPT-2's `wte`, the token
    embedding and the output head), in first-use order. zero3 gives them to the root: gathered once
    for all their uses, their summed gradient reduce-scattered once (`unit_vjp.py`)."""
    listed = [p for unit in units for p in unit.paths]
    return tuple(p for p in dict.fromkeys(listed) if listed.count(p) > 1)


def check_paths(units, params, model: str) -> None:
    """Every unit's paths name parameter subtrees, and a subtree used by several units is listed by the
    same path in each (`shared_paths` gives it to the root): never one unit's path inside another's.
    Otherwise one line naming the units, the paths and the fix."""
    listed = [(unit.name, path) for unit in units for path in unit.paths]
    for name, path in listed:
        try:
            at(params, path)
        except (KeyError, IndexError, TypeError, AttributeError):
            raise ConfigError(f"{model}.unit_specs(): unit {name!r} lists {'/'.join(map(str, path))!r}, which is not "
                              f"in nnx.state({model}) (a module held at two places is named once, by its first path): "
                              f"list the path nnx.state gives in every unit that uses it") from None
    for name, path in listed:
        for other, inner in listed:
            if len(path) < len(inner) and inner[:len(path)] == path:
                whole, part = "/".join(map(str, path)), "/".join(map(str, inner))
                raise ConfigError(f"{model}.unit_specs(): unit {name!r} lists {whole!r} and unit {other!r} "
                                  f"{part!r} inside it; a parameter shared by units must be listed by the same path "
                                  f"in each (it goes to the root): list {whole!r} in both, or split it")


def whole(loss_fn) -> Unit:
    """The whole loss as one unit: its parameters are the whole tree (path `()`), its input `(x, y)`,
    its output the loss. zero3 then gathers the whole model at once."""
    return Unit("loss", ((),), lambda params, xy: loss_fn(params[0], *xy))


def split(tree, units) -> list[tuple]:
    """A parameter-shaped tree -> per unit, the tuple of its subtrees."""
    return [tuple(at(tree, p) for p in unit.paths) for unit in units]


def join(parts, units) -> dict:
    """The inverse of `split`: per-unit subtrees -> one nested dict."""
    out: dict = {}
    for unit, subtrees in zip(units, parts, strict=True):
        for path, sub in zip(unit.paths, subtrees, strict=True):
            if not path:  # the whole tree
                return sub
            node = out
            for key in path[:-1]:
                node = node.setdefault(key, {})
            node[path[-1]] = sub
    return out
