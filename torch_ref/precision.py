"""Where a torch run computes below its own dtype, and the tool that keeps a float64 model in float64.

`Census(model, dtype)`: while it is open, every op the dispatcher runs is recorded with the floating dtype it
computed in (its floating outputs', else its inputs'), the module it ran in (forward: a global forward pre/post
hook keeps the current module's qualified name and class; backward: the module whose forward made the autograd
node being run, else "backward") and its phase; `summary()` is the census of jaxdp/core/census.py, the trace's
meta `precision`. `torch_ref.trace.Recorder` takes one during the first recorded step, on its own.

transformers computes some parts in float32 whatever the model's dtype (LlamaRMSNorm's upcast, eager attention's
`softmax(dtype=float32)`, rotary angles): a float64 model of theirs is not a float64 model, and the judge then
bounds its losses and gradients at float32's roundoff (docs/PARITY.md, "Precision census"). For the tight
float64 check, train and record under `keep_float64()`:

    with torch_ref.precision.keep_float64():
        ... parallelize, Recorder, train_step ...     # every downcast to float32 computes in float64
"""
from __future__ import annotations

import contextlib
from collections import Counter

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from jaxdp.core import census as census_mod

KEY = census_mod.KEY  # the trace meta key
TAG = "jaxdp_census_module"  # the autograd node's metadata key: the module whose forward made it
NO_COMPUTE = {"detach", "alias", "lift_fresh", "_local_scalar_dense", "empty", "empty_like", "empty_strided",
              "zeros", "zeros_like", "ones_like", "full", "new_empty", "new_zeros", "copy_", "set_"}


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def run_dtype(model: torch.nn.Module) -> str:
    """The most common floating dtype of `model`'s parameters (by elements); float32 when it has none."""
    count: Counter = Counter()
    for p in model.parameters():
        if p.is_floating_point():
            count[dtype_name(p.dtype)] += p.numel()
    return count.most_common(1)[0][0] if count else "float32"


def _float_dtypes(tree) -> list[str]:
    return [dtype_name(t.dtype) for t in tree_leaves(tree) if isinstance(t, torch.Tensor) and t.is_floating_point()]


class _Dispatch(TorchDispatchMode):
    def __init__(self, census: Census):
        super().__init__()
        self.census = census

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        try:
            self.census.record(func, args, kwargs, out)
        except Exception:  # noqa: BLE001 - a census never breaks the step it watches
            self.census.errors += 1
        return out


class _Tagger(TorchFunctionMode):
    """Above autograd: tags each new autograd node with the current module, for the backward's attribution."""

    def __init__(self, census: Census):
        super().__init__()
        self.census = census

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        where = self.census.current()
        if where is not None:
            for t in tree_leaves(out):
                node = getattr(t, "grad_fn", None) if isinstance(t, torch.Tensor) else None
                if node is not None and TAG not in node.metadata:
                    node.metadata[TAG] = where
        return out


class Census:
    """The dispatch-level record of the ops a run computes (module docstring); a context manager, or
    `start()` / `stop()`. `dtype`: the run's dtype (default: `model`'s parameters')."""

    def __init__(self, model: torch.nn.Module | None = None, dtype: str | None = None):
        self.names = {id(m): n for n, m in model.named_modules()} if model is not None else {}
        self.dtype = dtype or (run_dtype(model) if model is not None else "float32")
        self.counts: Counter = Counter()
        self.seen: set = set()
        self.stack: list = []
        self.errors = 0
        self._handles: list = []
        self._modes: list = []

    def current(self):
        return self.stack[-1] if self.stack else None

    def _pre(self, module, _args):
        self.stack.append((self.names.get(id(module), ""), type(module).__name__))

    def _post(self, _module, _args, _out):
        if self.stack:
            self.stack.pop()

    def record(self, func, args, kwargs, out) -> None:
        op = func.overloadpacket.__name__
        if func.is_view or op in NO_COMPUTE:
            return
        floats = _float_dtypes(out) or _float_dtypes((args, kwargs))
        dtype = census_mod.lowest(floats)
        if dtype is None:
            return
        self.seen.add(dtype)
        if not census_mod.lower(dtype, self.dtype):
            return
        node = torch._C._current_autograd_node()
        if node is not None:
            module, cls = node.metadata.get(TAG, ("backward", "")) if hasattr(node, "metadata") else ("backward", "")
            phase = "backward"
        else:
            module, cls = self.current() or ("", "")
            phase = "forward"
        self.counts[(module, cls, op, dtype, phase)] += 1

    def start(self) -> Census:
        hooks = torch.nn.modules.module
        self._handles = [hooks.register_module_forward_pre_hook(self._pre),
                         hooks.register_module_forward_hook(self._post, always_call=True)]
        self._modes = [_Tagger(self), _Dispatch(self)]
        for mode in self._modes:
            mode.__enter__()
        return self

    def stop(self) -> dict:
        """Close the record (idempotent) and return `summary()`."""
        for mode in reversed(self._modes):
            mode.__exit__(None, None, None)
        for handle in self._handles:
            handle.remove()
        self._modes, self._handles, self.stack = [], [], []
        return self.summary()

    def summary(self) -> dict:
        return census_mod.summary(self.dtype, self.counts, self.seen)

    def __enter__(self) -> Census:
        return self.start()

    def __exit__(self, *_) -> None:
        self.stop()


def census(model: torch.nn.Module, step, dtype: str | None = None) -> dict:
    """The census of one call `step()` (e.g. one `train_step`) on `model`."""
    with Census(model, dtype) as c:
        step()
    return c.summary()


F32, F64 = torch.float32, torch.float64


def _promoted(x):
    if x is F32:
        return F64
    if isinstance(x, str) and x in ("torch.FloatTensor", "float32", "float"):
        return "torch.DoubleTensor" if x == "torch.FloatTensor" else F64
    return x


class _KeepFloat64(TorchFunctionMode):
    """Turns every cast to float32 into one to float64, and every `dtype=torch.float32` (softmax's, a factory's)
    into float64: the float32 sites of a float64 model compute in float64."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func is torch.Tensor.float:
            func = torch.Tensor.double
        elif func in (torch.Tensor.to, torch.Tensor.type, torch.Tensor.type_as):
            args = tuple(_promoted(a) if i else a for i, a in enumerate(args))
            if func is not torch.Tensor.type_as and len(args) > 1 and isinstance(args[1], torch.Tensor) \
                    and args[1].dtype is F32:
                args = (args[0], args[1].device, F64) + args[2:]
            elif func is torch.Tensor.type_as and len(args) > 1 and args[1].dtype is F32:
                func, args = torch.Tensor.to, (args[0], args[1].device, F64)
        if kwargs.get("dtype") is F32:
            kwargs["dtype"] = F64
        return func(*args, **kwargs)


@contextlib.contextmanager
def keep_float64():
    """Inside: what would compute in float32 computes in float64 (casts, `dtype=float32` arguments, the default
    dtype), so that a float64 transformers model is float64 throughout and the judge's float64 bounds apply."""
    default = torch.get_default_dtype()
    torch.set_default_dtype(F64)
    try:
        with _KeepFloat64():
            yield
    finally:
        torch.set_default_dtype(default)
