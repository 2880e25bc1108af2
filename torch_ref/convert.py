"""Weight conversion between a torch `nn.Module` and Flax NNX parameters, bit for bit.

Names follow the module path: torch `blocks.0.attn.weight` is Flax `blocks/0/attn/<leaf>`, the leaf
and the layout chosen by the layer type (`RULES`): a Linear weight [out, in] is the kernel [in, out],
a ConvNd weight [O, I, *spatial] the kernel [*spatial, I, O], Embedding weight -> embedding,
LayerNorm / RMSNorm / BatchNorm weight -> scale, BatchNorm running_mean / running_var -> mean / var
(NNX's batch statistics; `num_batches_tracked` has no Flax counterpart and is left alone); by class
name (`NAMED_RULES`) transformers' `Conv1D` weight [in, out] -> kernel as it is, and `*RMSNorm` weight
-> scale. Other buffers (masks, caches; non-persistent ones always) are not state in Flax and are left
alone unless `names=` names them. `strip_prefix='transformer.'` removes that module path from the front
of the torch names before they become Flax names; a tied tensor is named once, by its first path
(torch_ref/convert_names.py).

`names=` maps torch names to Flax names, overriding the rules, one entry per tensor:
- `'proj/kernel'`: that Flax name, in the rule's layout (no axis change when the layer type has no rule);
- `('proj/kernel', (1, 0))`: that name and an explicit layout, the torch -> Flax axis permutation
  (`np.transpose` axes; the inverse is used going back);
- `None`: deliberately not converted (a torch-only tensor).
Anything unmatched (a torch tensor without a Flax name, a Flax leaf without a torch tensor), ambiguous
(two torch tensors on one Flax name) or mismatched (shape, dtype) is one `ConvertError` listing every
such name. Wrappers are seen through: DDP / DataParallel (`.module`) and `torch.compile` (`._orig_mod`).

A behaviour no tensor name carries is said, never dropped silently: `to_flax` warns (`ConvertWarning`, one
line each, `uncarried`) for an `nn.Embedding`'s `padding_idx` (its row gets no gradient) unless `target=`,
the Flax model the parameters are for, has the same `padding_idx` at that path, and for `max_norm` or
`scale_grad_by_freq` (no jaxdp layer has them).
"""
from __future__ import annotations

import warnings
from collections.abc import Mapping

import numpy as np
import torch
from torch import nn

from jaxdp.core.traces.recorder import unflatten  # the trace's names -> nested dicts (JAX-free)

from .convert_names import FIX, NAMED_RULES, RULES, ConvertError, Mapped, aliases, plan, raise_problems, unwrap

__all__ = ["FIX", "NAMED_RULES", "RULES", "ConvertError", "ConvertWarning", "Mapped", "unwrap", "mapping", "flax_names",
           "flax_array", "torch_tensor", "tensors_to_flax", "to_flax", "load_flax", "flatten", "uncarried"]


class ConvertWarning(UserWarning):
    """A behaviour of the torch model that the converted names cannot carry (`uncarried`)."""


def mapping(model: nn.Module, names: Mapping | None = None, strip_prefix: str = "") -> dict[str, Mapped]:
    """{torch name: Mapped(Flax name, axes)} for every parameter (in `named_parameters()` order), then
    the mapped buffers (in `named_buffers()` order). Torch names are `model`'s own (wrappers' prefixes
    included). Raises ConvertError listing every parameter without a Flax name and every Flax name
    claimed twice."""
    found, problems = plan(model, names, strip_prefix)
    raise_problems(problems)
    return found


def flax_names(model: nn.Module, names: Mapping | None = None, strip_prefix: str = "") -> dict[str, str]:
    """{torch name: Flax name} in `named_parameters()` order, then the mapped buffers, e.g.
    'layers.0.weight' -> 'layers/0/kernel'."""
    return {name: m.flax for name, m in mapping(model, names, strip_prefix).items()}


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
                    names: Mapping | None = None, strip_prefix: str = "") -> dict[str, np.ndarray]:
    """{torch name: tensor} (parameters, gradients, any subset; names with or without the wrappers'
    prefix, a tied tensor's other paths too) -> {Flax name: NumPy array in Flax layout}. Tensors
    deliberately left out (`names=` None, unmapped buffers such as `num_batches_tracked`) are dropped."""
    found, problems = plan(model, names, strip_prefix)
    inner, prefix = unwrap(model)
    alias = aliases(inner)
    known = {n for n, _ in inner.named_parameters(remove_duplicate=False)} | {
        n for n, _ in inner.named_buffers(remove_duplicate=False)}
    out = {}
    for key, t in tensors.items():
        name = key.removeprefix(prefix) if prefix and key.startswith(prefix) else key
        m = found.get(prefix + alias.get(name, name))
        if m is not None:
            out[m.flax] = flax_array(t, m.axes)
        elif name not in known:
            problems.append(f"torch {key!r} is no parameter or buffer of the model")
    raise_problems(problems)
    return out


def to_flax(model: nn.Module, names: Mapping | None = None, strip_prefix: str = "", target=None) -> dict:
    """The model's parameters and mapped buffers as a nested dict of NumPy arrays in Flax layout, the
    structure `nnx.to_pure_dict(nnx.state(flax_model))` has (int keys for list items). `target`: the
    Flax model they are for, checked for the behaviours names cannot carry (`uncarried`: a warning each)."""
    for line in uncarried(model, strip_prefix, target):
        warnings.warn(line, ConvertWarning, stacklevel=2)
    tensors = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    found = mapping(model, names, strip_prefix)
    return unflatten(tensors_to_flax(model, {n: tensors[n] for n in found}, names, strip_prefix))


@torch.no_grad()
def load_flax(model: nn.Module, params: Mapping, names: Mapping | None = None, strip_prefix: str = "") -> nn.Module:
    """Copy Flax parameters into `model` bit for bit and return it. `params`: nested (as
    `nnx.to_pure_dict(nnx.state(m))`, or an `nnx.State`) or flat ({'layers/0/kernel': array})."""
    found, problems = plan(model, names, strip_prefix)
    flat = flatten(params)
    tensors = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    problems += [f"torch {name!r} has no Flax {m.flax!r} in the parameters given"
                for name, m in found.items() if m.flax not in flat]
    used = {m.flax for m in found.values()}
    problems += [f"Flax {flax!r} has no torch tensor" for flax in flat if flax not in used]
    sources = {}
    for name, m in found.items():
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
    raise_problems(problems)
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



def uncarried(model: nn.Module, strip_prefix: str = "", target=None) -> list[str]:
    """Behaviours of the torch model that no tensor name carries, one line each: an `nn.Embedding`'s
    `padding_idx` unless `target` (a Flax module) has the same `padding_idx` at the embedding's path;
    its `max_norm` and `scale_grad_by_freq` always."""
    inner, _ = unwrap(model)
    lines = []
    for path, module in inner.named_modules():
        if not isinstance(module, nn.Embedding):
            continue
        given = getattr(_module_at(target, path.removeprefix(strip_prefix)), "padding_idx", None)
        if module.padding_idx is not None and given != module.padding_idx:
            seen = f"the target has {given!r}" if target is not None else "no target="
            lines.append(f"torch_ref.convert: {path} has padding_idx={module.padding_idx} (that row gets no gradient), "
                         f"which no name carries; {seen}: build the Flax model with padding_idx={module.padding_idx} "
                         f"(jaxdp.models.Llama takes it) and pass it as to_flax(..., target=model)")
        lines += [f"torch_ref.convert: {path} has {attr}={getattr(module, attr)}, which no name carries and no jaxdp "
                  f"layer has: write it into your Flax model's forward" for attr in ("max_norm", "scale_grad_by_freq")
                  if getattr(module, attr)]
    return lines


def _module_at(target, path: str):
    """The submodule of a Flax model at a torch module path ('layers.0.attn'), or None."""
    for key in path.split(".") if target is not None else ():
        try:
            target = target[int(key)] if key.isdigit() else getattr(target, key)
        except (AttributeError, IndexError, KeyError, TypeError):
            return None
    return target
