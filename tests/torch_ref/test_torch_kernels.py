"""`parallelize(kernels=, compute_dtype=, compile=)` (torch_ref/kernels.py), in a world of one rank in the pytest
process: fused bf16 computes on bf16 copies of the weights, cast once per forward (FSDP2's MixedPrecisionPolicy
under zero3), while the master parameters, their recorded gradients and the optimizer state stay fp32; the
optimizer is torch's fused one; the trace's `kernels_detail` says what ran; the one-line refusals. The judge on
the fused path at N = 2: tests/torch_ref/strategies/test_torch_strategies.py."""
from __future__ import annotations

import contextlib
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import torch_ref
from jaxdp.core.run.config import ConfigError, RunConfig
from tests import REPO
from torch_ref import kernels, launch, optim
from torch_ref.models.gpt2 import GPT2

SIZE = dict(vocab=29, seq_len=8, n_layer=2, n_head=2, d_model=16)
ADAMW = lambda params: torch.optim.AdamW(params, lr=3e-3, weight_decay=0.1)  # noqa: E731 (a user's factory)


@contextlib.contextmanager
def world_of_one():
    """A gloo group of one rank over a HashStore (`python -m torch_ref train --devices 1`'s)."""
    launch.init_process_group(torch.device("cpu"), 0, 1, 60.0, store=dist.HashStore())
    try:
        yield
    finally:
        dist.destroy_process_group()


def batch():
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, SIZE["vocab"], (4, SIZE["seq_len"]), generator=g), torch.randint(0, SIZE["vocab"], (4, 8))


def loss_fn(out, y):
    return F.cross_entropy(out.float().reshape(-1, out.shape[-1]), y.reshape(-1))


class Casts(TorchDispatchMode):
    """Counts the fp32 -> bf16 copies made of each master parameter (by its storage)."""

    def __init__(self, params):
        super().__init__()
        self.ptrs, self.count = {p.data_ptr(): 0 for p in params}, {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        src = args[0] if args else None
        if (func is torch.ops.aten._to_copy.default and torch.is_tensor(src) and src.data_ptr() in self.ptrs
                and (kwargs or {}).get("dtype") == torch.bfloat16):
            self.count[src.data_ptr()] = self.count.get(src.data_ptr(), 0) + 1
        return func(*args, **(kwargs or {}))


def weights_seen(model):
    """The dtypes of the weights each Linear, Embedding and LayerNorm holds while its forward runs."""
    seen = set()
    for m in model.modules():
        if isinstance(m, (torch.nn.Linear, torch.nn.Embedding, torch.nn.LayerNorm)):
            m.register_forward_pre_hook(lambda mod, args: seen.add(mod.weight.dtype))
    return seen


@pytest.mark.quick
@pytest.mark.parametrize("strategy", ["single", "ddp", "zero3"])
@pytest.mark.parametrize("kernels_", ["fused", "mirrored"])
def test_bf16_compute_keeps_fp32_master_parameters_gradients_and_state(strategy, kernels_):
    """fused: every weight is bf16 inside the forward (mirrored's autocast casts per op: the modules hold fp32);
    both: the parameters, the recorded gradients and Adam's moments stay fp32, and the names unchanged."""
    torch.manual_seed(0)
    module = GPT2(**SIZE)
    names = [n for n, _ in module.named_parameters()]
    seen = weights_seen(module)
    with world_of_one() if strategy != "single" else contextlib.nullcontext():
        model, opt = torch_ref.parallelize(module, strategy=strategy, optimizer=ADAMW, kernels=kernels_,
                                           compute_dtype=torch.bfloat16)
        par = torch_ref.api.state_of(model)
        par.return_grads = True
        torch_ref.train_step(model, opt, *batch(), loss_fn)
        detail = kernels.detail(par)
        assert [n for n, _ in module.named_parameters()] == names
        assert seen == ({torch.bfloat16} if kernels_ == "fused" else {torch.float32})
        assert {p.dtype for p in module.parameters()} == {torch.float32}
        assert list(par.grads) == names and {g.dtype for g in par.grads.values()} == {torch.float32}
        moments = [s["exp_avg"] for s in opt.state.values()]
        assert moments and {m.dtype for m in moments} == {torch.float32}
    bf16 = {"fused": "MixedPrecisionPolicy" if strategy == "zero3" else "cast once", "mirrored": "autocast"}
    assert detail["bf16"] == bf16[kernels_]
    assert detail["attention"] == ("sdpa:flash_attention" if kernels_ == "fused" else "mirrored")


@pytest.mark.quick
def test_fused_bf16_casts_each_weight_once_per_forward():
    """Each master parameter is copied to bf16 exactly once per forward (the tied `wte` too, used twice)."""
    module = GPT2(**SIZE)
    model, opt = torch_ref.parallelize(module, strategy="single", optimizer=ADAMW, kernels="fused",
                                       compute_dtype=torch.bfloat16)
    casts = Casts(module.parameters())
    with casts:
        model(batch()[0])
    assert len(casts.count) == len(list(module.parameters())) and set(casts.count.values()) == {1}


@pytest.mark.quick
@pytest.mark.parametrize("name", ["sgd", "momentum", "adam", "adamw"])
def test_the_cli_optimizer_is_torch_fused_one(name):
    cfg = RunConfig(optimizer=name, kernels="fused")
    assert optim.make(cfg, [torch.nn.Parameter(torch.zeros(2))]).defaults["fused"] is True
    assert not optim.make(cfg.replace(kernels="mirrored"), [torch.nn.Parameter(torch.zeros(2))]).defaults["fused"]


@pytest.mark.quick
def test_parallelize_asks_a_users_optimizer_for_its_fused_implementation():
    """A factory that did not ask for `fused` gets the same class, groups and hyperparameters, fused; zero1's
    ZeroRedundancyOptimizer builds its local optimizer fused; a class with no `fused` is kept as built."""
    groups = lambda ps: torch.optim.SGD([{"params": list(ps)[:1], "lr": 0.5}], lr=0.1, momentum=0.9)  # noqa: E731
    for factory, lrs in ((ADAMW, [3e-3]), (groups, [0.5])):
        model, opt = torch_ref.parallelize(GPT2(**SIZE), strategy="single", optimizer=factory, kernels="fused")
        assert opt.defaults["fused"] is True and [g["lr"] for g in opt.param_groups] == lrs
        assert all(g["fused"] for g in opt.param_groups)
    _, opt = torch_ref.parallelize(GPT2(**SIZE), strategy="single", optimizer=lambda ps: torch.optim.LBFGS(ps),
                                   kernels="fused")
    assert type(opt) is torch.optim.LBFGS
    with world_of_one():
        model, opt = torch_ref.parallelize(GPT2(**SIZE), strategy="zero1", optimizer=ADAMW, kernels="fused")
        torch_ref.train_step(model, opt, *batch(), loss_fn)
        assert opt.optim.defaults["fused"] is True
        assert kernels.detail(torch_ref.api.state_of(model))["optimizer"] == "fused"


@pytest.mark.quick
@pytest.mark.parametrize("bad, match", [
    (dict(kernels="fast"), r"kernels must be one of mirrored, fused, got 'fast'"),
    (dict(compute_dtype=torch.float16), r"compute_dtype must be None .* or torch.bfloat16, got torch.float16"),
    (dict(compile="yes"), r"compile must be True or False, got 'yes'"),
    (dict(kernels="fused", reduction="canonical"), r"kernels='fused' .* pass kernels='mirrored' or reduction="),
    (dict(compile=True, reduction="canonical"), r"compile=True with reduction='canonical'.* pass compile=False"),
])
def test_arguments_parallelize_cannot_take_are_one_line(bad, match):
    with pytest.raises(ConfigError, match=match) as e:
        torch_ref.parallelize(GPT2(**SIZE), strategy="single", optimizer=ADAMW, **bad)
    assert "\n" not in str(e.value)


@pytest.mark.quick
def test_the_cli_refuses_compile_with_the_canonical_reduction_in_one_line():
    done = subprocess.run([sys.executable, "-m", "torch_ref", "train", "--compile", "--reduction", "canonical",
                           "--steps", "1"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "--compile with --reduction canonical" in done.stderr and "drop --compile" in done.stderr


def test_compile_runs_a_step_and_says_so():
    """--compile: torch.compile of each unit's forward (here single, fused, bf16: the cast-once forward around
    compiled blocks); one step's loss is the uncompiled one's to bf16 roundoff."""
    losses = []
    for compile_ in (False, True):
        torch.manual_seed(0)
        model, opt = torch_ref.parallelize(GPT2(**SIZE), strategy="single", optimizer=ADAMW, kernels="fused",
                                           compute_dtype=torch.bfloat16, compile=compile_)
        losses.append(torch_ref.train_step(model, opt, *batch(), loss_fn))
        assert kernels.detail(torch_ref.api.state_of(model))["compile"] is compile_
    assert abs(losses[1] - losses[0]) < 2e-2 * abs(losses[0])


@pytest.mark.quick
def test_fused_bf16_casts_float_inputs_with_the_weights():
    """A model fed float inputs (the mlp, the cnn): cast once casts them as FSDP2's `cast_forward_inputs` does,
    else the first Linear meets fp32 inputs and bf16 weights."""
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    model, opt = torch_ref.parallelize(net, strategy="single", optimizer=ADAMW, kernels="fused",
                                       compute_dtype=torch.bfloat16)
    x, y = torch.randn(6, 3), torch.randint(0, 2, (6,))
    assert model(x).dtype == torch.bfloat16
    assert torch.isfinite(torch.tensor(torch_ref.train_step(model, opt, x, y, loss_fn)))


def test_only_the_attention_that_offers_the_choice_is_switched():
    """A user's module whose `kernels` attribute means something else (a conv's sizes) is theirs: fused switches
    the models' attention only, as jaxdp's `attention.switched` does, and `detail` reads only those."""
    model = GPT2(**SIZE)
    model.kernels = (3, 3)
    kernels.set_attention(model, "fused")
    assert model.kernels == (3, 3)
    assert {m.kernels for m in kernels.offered(model)} == {"fused"}
