"""Weight conversion between a torch `nn.Module` and Flax NNX parameters, bit for bit.

Names follow the module path: torch `blocks.0.attn.weight` is Flax `blocks/0/attn/<leaf>`, the leaf
and the layout chosen by the layer type (`RULES`): a Linear weight [out, in] is the kernel [in, out],
a ConvNd weight [O, I, *spatial] the kernel [*spatial, I, O], Embedding weight -> embedding,
LayerNorm / RMSNorm / BatchNorm weight -> scale, BatchNorm running_mean / running_var -> mean / var
(NNX's batch statistics; `num_batches_tracked` has no Flax counterpart and is left alone). Other
buffers (masks, caches) are not state in Flax and are left alone unless `names=` names them.

`names=` maps torch names to Flax names, overriding the rules, one entry per tensor:
- `'proj/kernel'`: that Flax name, in the rule's layout (no axis change when the layer type has no rule);
- `('proj/kernel', (1, 0))`: that name and an explicit layout, the torch -> Flax axis permutation
  (`np.transpose` axes; the inverse is used going back);
- `None`: deliberately not converted (a torch-only tensor).
Anything unmatched (a torch tensor without a Flax name, a Flax leaf without a torch tensor), ambiguous
(two torch tensors on one Flax name) or mismatched (shape, dtype) is one `ConvertError` listing every
such name. Wrappers are seen through: DDP / DataParallel (`.module`) and `torch.compile` (`._orig_mod`).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

import numpy as np
import torch
from torch import nn

from jaxdp.core.recorder import unflatten  # the trace's names -> nested dicts (JAX-free)

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
_WRAPPERS = (nn.parallel.DistributedDataParallel, nn.DataParallel)


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


def _by_rules(inner: nn.Module) -> tuple[dict[str, Mapped], dict[str, str]]:
    """{torch name: Mapped} from the rules, and {torch parameter name: why it has no Flax name}."""
    mapped, unknown = {}, {}
    for mod_name, module in inner.named_modules():
        rule = next((r for kind, r in RULES.items() if isinstance(module, kind)), {})
        tensors = [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)]
        for leaf, tensor in tensors:
            name = f"{mod_name}.{leaf}" if mod_name else leaf
            if leaf in rule:
                flax_leaf, axes = rule[leaf]
                mapped[name] = Mapped("/".join([*mod_name.split("."), flax_leaf]) if mod_name else flax_leaf,
                                      axes(tensor))
            elif isinstance(tensor, nn.Parameter):
                kind = type(module).__name__
                unknown[name] = f"torch {name!r} ({kind} {'has no rule' if not rule else f'has no {leaf!r}'})"
    return mapped, unknown


def _override(inner, prefix, mapped, unknown, names, problems) -> dict[str, Mapped | None]:
    """Apply `names=` (keys with or without the wrappers' prefix) to the rules' mapping."""
    tensors = {**dict(inner.named_parameters()), **dict(inner.named_buffers())}
    out: dict[str, Mapped | None] = dict(mapped)
    for key, value in (names or {}).items():
        name = key.removeprefix(prefix) if prefix and key not in tensors else key
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


def _plan(model: nn.Module, names: Mapping | None) -> tuple[dict[str, Mapped], list[str]]:
    """`mapping` without raising: the mapping and the problems found."""
    inner, prefix = unwrap(model)
    mapped, unknown = _by_rules(inner)
    problems: list[str] = []
    out = _override(inner, prefix, mapped, unknown, names, problems)
    problems += [f"{why} has no Flax name" for why in unknown.values()]
    claimed: dict[str, list[str]] = {}
    for name, m in out.items():
        if m is not None:
            claimed.setdefault(m.flax, []).append(name)
    problems += [f"Flax {flax!r} claimed by torch {', '.join(map(repr, torch_names))}"
                 for flax, torch_names in claimed.items() if len(torch_names) > 1]
    order = [n for n, _ in inner.named_parameters()] + [n for n, _ in inner.named_buffers()]
    return {prefix + n: out[n] for n in order if out.get(n) is not None}, problems


def mapping(model: nn.Module, names: Mapping | None = None) -> dict[str, Mapped]:
    """{torch name: Mapped(Flax name, axes)} for every parameter (in `named_parameters()` order), then
    the mapped buffers (in `named_buffers()` order). Torch names are `model`'s own (wrappers' prefixes
    included). Raises ConvertError listing every parameter without a Flax name and every Flax name
    claimed twice."""
    plan, problems = _plan(model, names)
    _raise(problems)
    return plan


def flax_names(model: nn.Module, names: Mapping | None = None) -> dict[str, str]:
    """{torch name: Flax name} in `named_parameters()` order, then the mapped buffers, e.g.
    'layers.0.weight' -> 'layers/0/kernel'."""
    return {name: m.flax for name, m in mapping(model, names).items()}


def flax_array(tensor: torch.Tensor, axes: tuple[int, ...] | None) -> np.ndarray:
    """One torch tensor as a NumPy array in Flax layout: a fresh C-contiguous copy, never a view of a
    live parameter. A DTensor (FSDP2) is gathered first (a collective: every rank calls it)."""
    t = tensor.detach()
    if hasattr(t, "full_tensor"):
        t = t.full_tensor()
    t = t.cpu()
    if axes is not None:
        t = t.permute(*axes)
    if t.dtype == torch.bfloat16:  # NumPy has no bfloat16: carry the bits through int16
        import ml_dtypes

        return np.ascontiguousarray(t.contiguous().view(torch.int16).numpy()).view(ml_dtypes.bfloat16)
    return np.array(t.numpy(), order="C", copy=True)


def torch_tensor(array, axes: tuple[int, ...] | None) -> torch.Tensor:
    """The inverse of `flax_array`: a Flax-layout array as a CPU tensor in torch layout, same bits."""
    a = np.ascontiguousarray(np.asarray(array))
    a = a if a.flags.writeable else a.copy()  # torch.from_numpy warns on read-only (JAX's) arrays
    if a.dtype.name == "bfloat16":
        t = torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    else:
        t = torch.from_numpy(a)
    return t.permute(*np.argsort(axes).tolist()) if axes is not None else t


def tensors_to_flax(model: nn.Module, tensors: Mapping[str, torch.Tensor],
                    names: Mapping | None = None) -> dict[str, np.ndarray]:
    """{torch name: tensor} (parameters, gradients, any subset; names with or without the wrappers'
    prefix) -> {Flax name: NumPy array in Flax layout}. Tensors deliberately left out (`names=` None,
    unmapped buffers such as `num_batches_tracked`) are dropped."""
    plan, problems = _plan(model, names)
    _, prefix = unwrap(model)
    known = {n for n, _ in model.named_parameters()} | {n for n, _ in model.named_buffers()}
    out = {}
    for name, t in tensors.items():
        m = plan.get(name) or plan.get(prefix + name)
        if m is not None:
            out[m.flax] = flax_array(t, m.axes)
        elif name not in known and prefix + name not in known:
            problems.append(f"torch {name!r} is no parameter or buffer of the model")
    _raise(problems)
    return out


def to_flax(model: nn.Module, names: Mapping | None = None) -> dict:
    """The model's parameters and mapped buffers as a nested dict of NumPy arrays in Flax layout, the
    structure `nnx.to_pure_dict(nnx.state(flax_model))` has (int keys for list items)."""
    tensors = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    return unflatten(tensors_to_flax(model, {n: tensors[n] for n in mapping(model, names)}, names))


@torch.no_grad()
def load_flax(model: nn.Module, params: Mapping, names: Mapping | None = None) -> nn.Module:
    """Copy Flax parameters into `model` bit for bit and return it. `params`: nested (as
    `nnx.to_pure_dict(nnx.state(m))`, or an `nnx.State`) or flat ({'layers/0/kernel': array})."""
    plan, problems = _plan(model, names)
    flat = flatten(params)
    tensors = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    problems += [f"torch {name!r} has no Flax {m.flax!r} in the parameters given"
                for name, m in plan.items() if m.flax not in flat]
    used = {m.flax for m in plan.values()}
    problems += [f"Flax {flax!r} has no torch tensor" for flax in flat if flax not in used]
    sources = {}
    for name, m in plan.items():
        if m.flax in flat:
            dst, array = tensors[name], np.asarray(flat[m.flax])
            if m.axes is not None and array.ndim != len(m.axes):
                problems.append(f"Flax {m.flax!r} {array.shape} vs torch {name!r} {tuple(dst.shape)}")
                continue
            src = torch_tensor(array, m.axes)
            if src.shape != dst.shape or src.dtype != dst.dtype:
                cast = " (cast one side: a bit-for-bit copy needs equal dtypes)" if src.dtype != dst.dtype else ""
                problems.append(f"Flax {m.flax!r} {tuple(src.shape)} {src.dtype} (in torch layout) vs torch "
                                f"{name!r} {tuple(dst.shape)} {dst.dtype}{cast}")
            sources[name] = src
    _raise(problems)
    for name, src in sources.items():
        dst = tensors[name]
        if hasattr(dst, "device_mesh"):  # a DTensor (FSDP2): every rank calls, rank 0's values are kept
            from torch.distributed.tensor import distribute_tensor

            src = distribute_tensor(src.to(dst.device), dst.device_mesh, dst.placements)
        dst.copy_(src)
    return model


def flatten(tree: Mapping, prefix: str = "") -> dict:
    """A nested mapping (int keys allowed) -> {'a/0/b': leaf}; flat '/'-named keys pass through.
    NNX Variables are unwrapped to their value."""
    out = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, name + "/"))
        else:
            out[name] = value.get_value() if hasattr(value, "get_value") else value
    return out




def _raise(problems: list[str]) -> None:
    if problems:
        raise ConvertError(f"{len(problems)} tensor(s) do not match between torch and Flax: "
                           f"{'; '.join(problems)}; {FIX}")
