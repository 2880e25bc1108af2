"""Which Flax name and layout each torch tensor of a model takes (`torch_ref.convert` applies the plan).

A tensor's Flax name is its module path with '/' for '.', the leaf and the layout chosen by the layer
(`RULES` by type, then `NAMED_RULES` by class name, for layers of libraries torch_ref does not import,
such as transformers' `Conv1D` and `LlamaRMSNorm`). `strip_prefix` removes a module path from the
front of every torch name that starts with it ('transformer.': `transformer.h.0.ln_1.weight` ->
`h/0/ln_1/scale`). A tensor reachable under several module paths (a tied weight: `lm_head.weight` is
`transformer.wte.weight`) is named once: keyed by its first path in `named_parameters()` order (the
other paths are aliases of it), its Flax name from its first path that a rule maps. Non-persistent
buffers (`module._non_persistent_buffers_set`: rotary `inv_freq`, BERT's `position_ids`) are not
state and are never converted unless `names=` names them.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from torch import nn

FIX = ("fix: pass names={torch name: Flax name, (Flax name, axes) or None}, or filter the Flax state "
       "(nnx.state(model, nnx.Param, nnx.BatchStat))")


class ConvertError(ValueError):
    """Torch and Flax parameters that do not correspond; the message lists every offending name."""


class Mapped(NamedTuple):
    """Where one torch tensor goes: its Flax name and the torch -> Flax axis permutation (None: same)."""
    flax: str
    axes: tuple[int, ...] | None


def _linear_axes(t):
    return (1, 0)


def _conv_axes(t):  # [O, I, *spatial] -> [*spatial, I, O]
    return (*range(2, t.ndim), 1, 0)


def _same(t):
    return None


_NORM = {"weight": ("scale", _same), "bias": ("bias", _same)}
_BATCH_NORM = {**_NORM, "running_mean": ("mean", _same), "running_var": ("var", _same)}
# layer type -> {torch leaf: (Flax leaf, torch tensor -> axes)}; the first matching type wins.
RULES: dict[type, dict] = {
    nn.Linear: {"weight": ("kernel", _linear_axes), "bias": ("bias", _same)},
    nn.Conv1d: {"weight": ("kernel", _conv_axes), "bias": ("bias", _same)},
    nn.Conv2d: {"weight": ("kernel", _conv_axes), "bias": ("bias", _same)},
    nn.Conv3d: {"weight": ("kernel", _conv_axes), "bias": ("bias", _same)},
    nn.Embedding: {"weight": ("embedding", _same)},
    nn.LayerNorm: _NORM,
    nn.RMSNorm: {"weight": ("scale", _same)},
    nn.BatchNorm1d: _BATCH_NORM,
    nn.BatchNorm2d: _BATCH_NORM,
    nn.BatchNorm3d: _BATCH_NORM,
    nn.SyncBatchNorm: _BATCH_NORM,
}
# Layers matched by class name (libraries torch_ref does not import), when no type rule matched:
# transformers' `Conv1D` (GPT-2) keeps its weight [in, out], Flax's kernel layout already; an RMSNorm of
# a model library (`LlamaRMSNorm`, ...) has one `weight`, the scale (a name ending in "RMSNorm").
NAMED_RULES: dict[str, dict] = {
    "Conv1D": {"weight": ("kernel", _same), "bias": ("bias", _same)},
    "*RMSNorm": {"weight": ("scale", _same)},
}
_WRAPPERS = (nn.parallel.DistributedDataParallel, nn.DataParallel)


def rule_of(module: nn.Module) -> dict:
    """The module's rule: by type (`RULES`), else by class name (`NAMED_RULES`, '*' a suffix match), else {}."""
    rule = next((r for kind, r in RULES.items() if isinstance(module, kind)), None)
    if rule is not None:
        return rule
    name = type(module).__name__
    return next((r for key, r in NAMED_RULES.items()
                 if key == name or (key.startswith("*") and name.endswith(key[1:]))), {})


def unwrap(model: nn.Module) -> tuple[nn.Module, str]:
    """The user's module inside DDP / DataParallel / torch.compile wrappers, and the name prefix the
    wrappers add (e.g. 'module.', '_orig_mod.')."""
    prefix = ""
    while True:
        if isinstance(model, _WRAPPERS):
            model, prefix = model.module, prefix + "module."
        elif isinstance(getattr(model, "_orig_mod", None), nn.Module):  # torch.compile's OptimizedModule
            model, prefix = model._orig_mod, prefix + "_orig_mod."
        else:
            return model, prefix


def tensors_of(inner: nn.Module) -> dict:
    """{torch name: tensor}: every parameter, then every buffer, each once, by its first path."""
    return {**dict(inner.named_parameters()), **dict(inner.named_buffers())}


def aliases(inner: nn.Module) -> dict[str, str]:
    """{another path of a tensor: its first path}, for tensors reachable under several module paths
    (tied weights, a module used in two places)."""
    first = {id(t): name for name, t in tensors_of(inner).items()}
    every = [*inner.named_parameters(remove_duplicate=False), *inner.named_buffers(remove_duplicate=False)]
    return {name: first[id(t)] for name, t in every if first[id(t)] != name}


def _flax_name(torch_name: str, flax_leaf: str, strip_prefix: str) -> str:
    parts = torch_name.removeprefix(strip_prefix).split(".")
    return "/".join([*parts[:-1], flax_leaf])


def _by_rules(inner: nn.Module, strip_prefix: str) -> tuple[dict[str, Mapped], dict[str, str]]:
    """{torch name: Mapped} from the rules, and {torch parameter name: why it has no Flax name}. A tied
    tensor is keyed by its first path and named by its first path that a rule maps (BERT's decoder bias
    is first `cls.predictions.bias`, a parameter of a head without a rule, then `...decoder.bias`)."""
    first = {id(t): name for name, t in tensors_of(inner).items()}
    mapped, unknown = {}, {}
    for mod_name, module in inner.named_modules(remove_duplicate=False):
        rule, skip = rule_of(module), getattr(module, "_non_persistent_buffers_set", set())
        tensors = [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)]
        for leaf, tensor in tensors:
            name, path = first.get(id(tensor)), f"{mod_name}.{leaf}" if mod_name else leaf
            if name is None or name in mapped or leaf in skip:  # named already, or not state
                continue
            if leaf in rule:
                flax_leaf, axes = rule[leaf]
                mapped[name] = Mapped(_flax_name(path, flax_leaf, strip_prefix), axes(tensor))
                unknown.pop(name, None)
            elif isinstance(tensor, nn.Parameter) and name not in unknown:
                kind = type(module).__name__
                unknown[name] = f"torch {name!r} ({kind} {'has no rule' if not rule else f'has no {leaf!r}'})"
    return mapped, unknown


def _override(inner, prefix, mapped, unknown, names, problems) -> dict[str, Mapped | None]:
    """Apply `names=` (keys with or without the wrappers' prefix, aliases of tied tensors too)."""
    tensors, alias = tensors_of(inner), aliases(inner)
    out: dict[str, Mapped | None] = dict(mapped)
    for key, value in (names or {}).items():
        name = key.removeprefix(prefix) if prefix and key not in tensors else key
        name = alias.get(name, name)
        if name not in tensors:
            problems.append(f"names= has {key!r}: no such torch parameter or buffer")
            continue
        unknown.pop(name, None)
        if value is None or isinstance(value, str):
            out[name] = None if value is None else Mapped(value, mapped[name].axes if name in mapped else None)
        elif _is_entry(value, tensors[name].ndim):
            out[name] = Mapped(value[0], tuple(value[1]) if value[1] is not None else None)
        else:
            problems.append(f"names= has {key!r}: {value!r} is not a Flax name, (Flax name, axes) with axes a "
                            f"permutation of {tuple(range(tensors[name].ndim))}, or None")
    return out


def _is_entry(value, ndim: int) -> bool:
    """(Flax name, axes): axes None or a permutation of the tensor's axes."""
    if not (isinstance(value, (tuple, list)) and len(value) == 2 and isinstance(value[0], str)):
        return False
    return value[1] is None or sorted(value[1]) == list(range(ndim))


def check_strip_prefix(strip_prefix, prefix: str = "") -> str:
    """`strip_prefix` as the inner model's module path to remove ('' for none); a wrappers' prefix in
    front of it is accepted ('module.transformer.')."""
    if not isinstance(strip_prefix, str) or (strip_prefix and not strip_prefix.endswith(".")):
        raise ConvertError(f"strip_prefix={strip_prefix!r} is not a module path ending in '.'; pass e.g. "
                           f"strip_prefix='transformer.' (removed from the front of every torch name with it)")
    return strip_prefix.removeprefix(prefix) if prefix else strip_prefix


def plan(model: nn.Module, names: Mapping | None, strip_prefix: str = "") -> tuple[dict[str, Mapped], list[str]]:
    """`convert.mapping` without raising: {torch name: Mapped} (the model's own names, in
    `named_parameters()` then `named_buffers()` order) and the problems found."""
    inner, prefix = unwrap(model)
    mapped, unknown = _by_rules(inner, check_strip_prefix(strip_prefix, prefix))
    problems: list[str] = []
    out = _override(inner, prefix, mapped, unknown, names, problems)
    problems += [f"{why} has no Flax name" for why in unknown.values()]
    claimed: dict[str, list[str]] = {}
    for name, m in out.items():
        if m is not None:
            claimed.setdefault(m.flax, []).append(name)
    problems += [f"Flax {flax!r} claimed by torch {', '.join(map(repr, torch_names))}"
                 for flax, torch_names in claimed.items() if len(torch_names) > 1]
    return {prefix + n: out[n] for n in tensors_of(inner) if out.get(n) is not None}, problems


def raise_problems(problems: list[str]) -> None:
    if problems:
        raise ConvertError(f"{len(problems)} tensor(s) do not match between torch and Flax: "
                           f"{'; '.join(problems)}; {FIX}")
