"""zero3's FSDP2 groups for any model: the default units of a model jaxdp does not know, and shared
parameters kept in one group (the torch side of `jaxdp.models.units.shared_paths`).

FSDP2 manages each parameter in one group: the first `fully_shard` whose module tree reaches a module
owning it (a module already sharded is not entered), the root taking the rest. A parameter owned by
modules in two groups (a tied weight: GPT-2's `lm_head.weight` is `wte.weight`; one module used in two
blocks) fails FSDP2's lazy init at the first step ("shared with a parameter already managed by another
FSDP group"). Here the groups are worked out before any `fully_shard`: the default units give a shared
parameter to the root (each unit reaching one keeps only its largest submodules that reach none), and
units the user gave that split one are an error naming `units=` and the parameter.
"""
from __future__ import annotations

from torch import nn

from jaxdp.core.run.config import ConfigError


def _has_params(module: nn.Module) -> bool:
    return any(True for _ in module.parameters())


def blocks(model: nn.Module) -> list[list[nn.Module]]:
    """The default units of a model jaxdp does not know: each item owning parameters of the model's
    outermost `nn.ModuleList`s, in module order (a model library's decoder layers: HF GPT-2's
    `transformer.h`, Llama's `model.layers`, BERT's `encoder.layer`), the rest left to the root; a
    model without a ModuleList: each direct child owning parameters."""
    found: list[list[nn.Module]] = []
    seen: set[int] = set()

    def visit(module):
        for child in module.children():
            if id(child) in seen:
                continue
            seen.add(id(child))
            if isinstance(child, nn.ModuleList):
                found.extend([item] for item in child if _has_params(item) and id(item) not in seen)
                seen.update(id(item) for item in child)
            else:
                visit(child)

    visit(model)
    return found or [[child] for child in model.children() if _has_params(child)]


def _managed(unit: list[nn.Module], sharded: set[int]) -> list[nn.Module]:
    """The modules one `fully_shard(unit)` manages: the unit's trees, not entering sharded modules."""
    out, seen = [], set()

    def dfs(module):
        if id(module) in seen:
            return
        seen.add(id(module))
        out.append(module)
        for child in module.children():
            if id(child) not in sharded:
                dfs(child)

    for module in unit:
        dfs(module)
    return out


def groups_of(model: nn.Module, units: list[list[nn.Module]]) -> dict[int, set[int]]:
    """{id(parameter): the groups holding it} as FSDP2 forms them, `units` sharded in order and then the
    root (group `len(units)`)."""
    owners: dict[int, set[int]] = {}
    sharded: set[int] = set()
    for group, unit in enumerate([*units, [model]]):
        for module in _managed(unit, sharded):
            for p in module.parameters(recurse=False):
                owners.setdefault(id(p), set()).add(group)
        sharded.update(id(m) for m in unit)
    return owners


def _pieces(module: nn.Module, shared: set[int]) -> list[nn.Module]:
    """The largest submodules of `module` reaching no parameter in `shared` (the others: the root's)."""
    if not any(id(p) in shared for p in module.parameters()):
        return [module]
    return [piece for child in module.children() for piece in _pieces(child, shared)]


def without_shared(model: nn.Module, units: list[list[nn.Module]]) -> list[list[nn.Module]]:
    """The default units with every shared parameter left to the root: a unit reaching one keeps its
    largest submodules that reach none, as one group (none: the unit is dropped)."""
    while shared := {p for p, groups in groups_of(model, units).items() if len(groups) > 1}:
        units = [kept for unit in units
                 if (kept := [piece for m in unit for piece in _pieces(m, shared) if _has_params(piece)])]
    return units


def check_shared(model: nn.Module, units: list[list[nn.Module]]) -> None:
    """Units the user gave must not split a shared parameter between groups: one line naming it."""
    groups = groups_of(model, units)
    paths: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        paths.setdefault(id(p), []).append(name)
    for p in paths:
        if len(held := groups.get(p, set())) > 1:
            where = " and ".join("the root" if g == len(units) else f"units[{g}]" for g in sorted(held))
            first, *others = paths[p]
            also = f" (also {', '.join(map(repr, others))})" if others else ""
            raise ConfigError(f"units= splits the shared parameter {first!r}{also} between {where}: FSDP2 manages "
                              f"a shared parameter in one group; put every module using it in one unit, or leave "
                              f"them to the root (in no unit)")
