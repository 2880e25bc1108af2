"""`parallelize(kernels=, compute_dtype=, compile=)`: how torch computes (docs/KERNELS.md, "PyTorch").

- `kernels="fused"`: every submodule with a `kernels` attribute (gpt, gpt2 and llama's attention) runs
  `models/attention.py`'s SDPA; the optimizer is rebuilt with `fused=True` where its class takes `fused`.
- `compute_dtype=torch.bfloat16`: mirrored, the forward under autocast (`autocast_forward`: a cast per op
  call); fused, the weights cast to bf16 once per forward: FSDP2's `MixedPrecisionPolicy` (bf16 gathers,
  fp32 reduce-scatter) for the strategies built on `fully_shard` (`FULLY_SHARD`), and `cast_once` for the
  others. Either way the fp32 master parameters keep the names, get the fp32 gradients (each cast's backward
  casts back) and the optimizer's fp32 state.
- `compile=True`: `torch.compile` of each unit's forward (`compile_units`), the units zero3 shards (the
  blocks, as torchtitan compiles them), for every strategy: the wrappers' hooks (DDP, FSDP2, the hand-written
  ones), the bf16 cast and the names stay eager and unchanged.
`detail` reads back from the built objects which kernels ran (the trace's meta `kernels_detail`).
"""
from __future__ import annotations

import functools
import inspect

import torch
from torch.utils._pytree import tree_map

from jaxdp.core.config import ConfigError
from jaxdp.core.registry import strategies as registry

from .models import attention

FULLY_SHARD = registry.names("torch", fully_shard=True)  # built on FSDP2's fully_shard (bf16: MixedPrecisionPolicy)
COMPUTE_DTYPES = (None, torch.bfloat16)


def check(kernels, compute_dtype, compile, reduction: str) -> None:
    """One ConfigError line for an argument `parallelize` cannot take."""
    if kernels not in attention.KERNELS:
        raise ConfigError(f"kernels must be one of {', '.join(attention.KERNELS)}, got {kernels!r}")
    if compute_dtype not in COMPUTE_DTYPES:
        raise ConfigError(f"compute_dtype must be None (the parameters' dtype) or torch.bfloat16, got "
                          f"{compute_dtype!r}; pass compute_dtype=torch.bfloat16 for bf16 compute")
    if not isinstance(compile, bool):
        raise ConfigError(f"compile must be True or False, got {compile!r}")
    if kernels == "fused" and reduction == "canonical":
        raise ConfigError("kernels='fused' sums in the kernels' own order, so reduction='canonical' cannot give "
                          "the same bits on any N: pass kernels='mirrored' or reduction='native'")
    if compile and reduction == "canonical":
        raise ConfigError("compile=True with reduction='canonical': inductor's kernels fix no summation order the "
                          "canonical tree could hold on any N; pass compile=False or reduction='native'")


def offered(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The submodules that offer the choice: a `kernels` attribute of "mirrored" or "fused" (the models'
    attention), as jaxdp's `attention.switched` reads them; an attribute of that name meaning anything else is
    the user's."""
    return [m for m in model.modules() if getattr(m, "kernels", None) in attention.KERNELS]


def set_attention(model: torch.nn.Module, kernels: str) -> None:
    """kernels='fused': every submodule that offers the choice (`offered`: the models' attention) runs fused."""
    if kernels == "fused":
        for module in offered(model):
            module.kernels = "fused"


def fused_optimizer(optimizer):
    """The factory `optimizer`, its optimizer rebuilt with fused=True where its class takes `fused` (SGD,
    Adam, AdamW; their param groups and hyperparameters kept); any other class as built."""
    def build(params):
        built = optimizer(params)
        accepted = inspect.signature(type(built).__init__).parameters
        if "fused" not in accepted or built.defaults.get("fused"):
            return built
        fused = {"fused": True, **({"foreach": None} if "foreach" in accepted else {})}  # (fused excludes foreach)
        defaults = {k: v for k, v in built.defaults.items() if k in accepted} | fused
        return type(built)([dict(g, **fused) for g in built.param_groups], **defaults)

    return build


def autocast_forward(module: torch.nn.Module, device_type: str) -> None:
    """Mirrored bf16: the module's forward runs under autocast (bf16 compute, fp32 master parameters);
    the loss and backward stay outside it, as torch's AMP recipe has them."""
    forward = module.forward

    @functools.wraps(forward)
    def autocast(*args, **kwargs):
        with torch.autocast(device_type, dtype=torch.bfloat16):
            return forward(*args, **kwargs)

    module.forward = autocast
    module._torch_ref_bf16 = "autocast"


def cast_once(module: torch.nn.Module, dtype: torch.dtype = torch.bfloat16) -> None:
    """Fused bf16 without FSDP2: the module's forward runs on `dtype` copies of its floating parameters, each
    cast once per forward (`torch.func.functional_call`), so autograd sums every use of a copy and casts the
    gradient back onto the fp32 master parameter (DDP's and the hand-written strategies' hooks fire on it).
    Float inputs are cast too; buffers stay as they are. functional_call calls the module again: that inner call
    runs the original forward."""
    forward = module.forward
    inside = [False]

    @functools.wraps(forward)
    def cast(*args, **kwargs):
        if inside[0]:
            return forward(*args, **kwargs)
        copies = {name: p.to(dtype) if p.is_floating_point() else p for name, p in module.named_parameters()}
        args, kwargs = tree_map(lambda a: a.to(dtype) if torch.is_tensor(a) and a.is_floating_point() else a,
                                (args, kwargs))  # float inputs too, as FSDP2's cast_forward_inputs
        inside[0] = True
        try:
            return torch.func.functional_call(module, copies, args, kwargs)
        finally:
            inside[0] = False

    module.forward = cast
    module._torch_ref_bf16 = "cast once"


def mixed_precision(compute_dtype):
    """FSDP2's policy for `compute_dtype` under kernels='fused' (None: no policy): bf16 gathered
    parameters, fp32 gradients reduced in fp32."""
    if compute_dtype is None:
        return None
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)


def compile_units(units: list[list[torch.nn.Module]]) -> None:
    """torch.compile each unit's modules' forward (hooks, wrappers and parameter names untouched)."""
    for unit in units:
        for module in unit:
            module.forward = torch.compile(module.forward)
            module._torch_ref_compiled = True


def detail(par) -> dict:
    """What ran, read from the built objects: the attention ('sdpa' or 'mirrored'), the optimizer's
    implementation, whether units were compiled, and how bf16 was computed."""
    module, optimizer = par.module, par.optimizer
    inner = getattr(optimizer, "optim", optimizer)  # ZeroRedundancyOptimizer's local optimizer
    p = next(module.parameters())
    foreach = inner.defaults.get("foreach")  # None: torch's default, foreach for CUDA tensors
    impl = ("fused" if inner.defaults.get("fused") else "foreach" if foreach or (foreach is None and p.is_cuda)
            else "for-loop")
    states = [m._get_fsdp_state() for m in module.modules() if hasattr(m, "_get_fsdp_state")]
    policy = next((s._mp_policy.param_dtype for s in states if s._mp_policy.param_dtype is not None), None)
    bf16 = ("MixedPrecisionPolicy" if policy == torch.bfloat16 else
            getattr(module, "_torch_ref_bf16", None))
    layers = offered(module)
    kinds = {m.kernels for m in layers}
    sdpa = f"sdpa:{attention.backend(torch.bfloat16 if bf16 else p.dtype, p.device, *heads(layers[0]))}" \
        if kinds == {"fused"} else None
    return {"attention": sdpa or ("mirrored" if kinds else None), "optimizer": impl,
            "compile": any(getattr(m, "_torch_ref_compiled", False) for m in module.modules()), "bf16": bf16}


def prepare(model: torch.nn.Module, strategy: str, optimizer, kernels: str, compute_dtype, compile: bool):
    """`model` set up as `parallelize` was asked, before the strategy wraps it: the attention, the bf16
    forward (autocast or cast once) and the compiled units. Returns (the optimizer factory, FSDP2's
    MixedPrecisionPolicy or None) for the strategy to build with."""
    from .strategies.zero import zero3

    set_attention(model, kernels)
    policy = None
    if compute_dtype is not None and kernels == "mirrored":
        autocast_forward(model, next(model.parameters()).device.type)
    elif compute_dtype is not None and strategy in FULLY_SHARD:
        policy = mixed_precision(compute_dtype)
    elif compute_dtype is not None:
        cast_once(model, compute_dtype)
    if compile:
        compile_units(zero3.units_of(model))
    return (fused_optimizer(optimizer) if kernels == "fused" else optimizer), policy


def heads(layer: torch.nn.Module) -> tuple[int, int, int]:
    """(heads, kv heads, head dim) of one of torch_ref's attention modules (its first Linear reads d_model);
    a module of another kind: a small stand-in, (2, 2, 8)."""
    linear = next((m for m in layer.modules() if isinstance(m, torch.nn.Linear)), None)
    if not isinstance(getattr(layer, "n_head", None), int) or linear is None:
        return 2, 2, 8
    return layer.n_head, getattr(layer, "n_kv_head", layer.n_head), linear.in_features // layer.n_head
