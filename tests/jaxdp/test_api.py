"""`jaxdp.parallelize` on a model the project never saw: a pure JAX function written here (a tanh
layer, a LayerNorm-like normalisation, a bias-free output layer; squared error against float
targets), trained under every strategy with a user's optax clipping chain, each step equal to an
independent reference (`jax.value_and_grad` + the same chain, no jaxdp) in float64 to 1e-10; the
clipping check shown to fail when ZeRO clips by the shard's norm; bad input, one line each."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import jaxdp
from jaxdp import devices as jaxdp_devices
from jaxdp.core.run.config import ConfigError
from jaxdp.models import from_module, units
from jaxdp.optax_check import ShapeDependentOptimizer, check_elementwise
from tests import mutations

FEATURES, HIDDEN, OUT, ROWS, STEPS = 5, 7, 3, 36, 3  # 36 rows: N in {1, 2, 3} x accum in {1, 3} divide it
CLIP, LR = 0.05, 0.02
TOL = 1e-10


def forward(params, x):
    h = jnp.tanh(x @ params["hidden"]["w"] + params["hidden"]["b"])
    mean = h.mean(-1, keepdims=True)
    h = (h - mean) / jnp.sqrt(((h - mean) ** 2).mean(-1, keepdims=True) + 1e-5) * params["norm"]["scale"]
    return h @ params["out"]["w"]  # no bias


def loss_fn(params, x, y):
    return jnp.mean(jnp.sum((forward(params, x) - y) ** 2, -1))


def initial_params():
    rng = np.random.default_rng(0)
    return {"hidden": {"w": rng.normal(size=(FEATURES, HIDDEN)) / 2, "b": rng.normal(size=HIDDEN) / 10},
            "norm": {"scale": 1 + rng.normal(size=HIDDEN) / 10},
            "out": {"w": rng.normal(size=(HIDDEN, OUT)) / 3}}


def batch(k: int):
    rng = np.random.default_rng(100 + k)
    return rng.normal(size=(ROWS, FEATURES)), rng.normal(size=(ROWS, OUT))


def chain():
    return optax.chain(optax.clip_by_global_norm(CLIP), optax.adam(LR))


@functools.cache
def reference():
    """[(grads, params after the step)] per step: plain JAX, the whole batch at once."""
    params, opt = initial_params(), chain()
    state, out = opt.init(params), []
    grad_fn = jax.jit(jax.grad(loss_fn))
    for k in range(1, STEPS + 1):
        grads = grad_fn(params, *batch(k))
        assert optax.tree.norm(grads) > 2 * CLIP  # the clipping bites at every step
        updates, state = opt.update(grads, state, params)
        params = optax.apply_updates(params, updates)
        out.append(jax.tree.map(np.asarray, (grads, params)))
    return out


def train(strategy, n, accum, on_mesh=False, **options):
    where = {"mesh": jaxdp_devices.mesh(jax.devices()[:n])} if on_mesh else {"devices": n}
    par = jaxdp.parallelize(loss_fn, initial_params(), chain(), strategy=strategy, accum=accum, return_grads=True,
                            **where, **options)
    state, out = par.init(), []
    for k in range(1, STEPS + 1):
        state, metrics = par.step(state, *batch(k))
        out.append((metrics["grads"], par.params(state)))
    return out


def worst_error(got, ref) -> float:
    errors = [np.abs(np.asarray(a) - b).max() / np.abs(b).max() for step_got, step_ref in zip(got, ref, strict=True)
              for a, b in zip(jax.tree.leaves(step_got), jax.tree.leaves(step_ref), strict=True)]
    assert len(errors) == 2 * 4 * STEPS
    return max(errors)


# Every strategy with every N in {1, 2, 3} (single: N = 1), each strategy with and without
# accumulation (accum alternates with N), and the options: tiny buckets, the ring collectives, FSDP2's
# reshard_after_forward=False under the `fsdp` alias, a mesh given instead of a count.
EXTRA = {("ddp-bucket", 1): {"bucket_mb": 1e-4}, ("ddp-bucket", 3): {"bucket_mb": 1e-4},
         ("ddp-ring", 2): {"on_mesh": True}, ("zero2", 2): {"collectives": "ring"},
         ("zero3", 2): {"reshard_after_forward": False}}
CASES = [("single", 1, 3, {})] + [
    ("fsdp" if (s, n) == ("zero3", 2) else s, n, 3 if (i + n) % 2 else 1, EXTRA.get((s, n), {}))
    for i, s in enumerate(("dp", "ddp", "ddp-pmap", "ddp-bucket", "ddp-ring", "zero1", "zero2", "zero3"))
    for n in (1, 2, 3)]


@pytest.mark.parametrize(("strategy", "n", "accum", "options"), CASES,
                         ids=[f"{s}-x{n}-accum{a}" for s, n, a, _ in CASES])
def test_every_step_equals_the_independent_reference(strategy, n, accum, options):
    assert worst_error(train(strategy, n, accum, **options), reference()) < TOL


def test_zero_clipping_by_the_shards_norm_fails_the_check():
    """The mutation: ZeRO's optimizer applied to each device's shard alone (clipping by the shard's
    norm). Step 1's gradient still agrees; the parameters do not."""
    with mutations.inject("jax", "clip-shard-norm"):
        got = train("zero2", 2, 1)
    (grads, _), (want, _) = got[0], reference()[0]
    assert worst_error([(grads, grads)] * STEPS, [(want, want)] * STEPS) < TOL
    assert worst_error(got, reference()) > 1e-4


def test_an_nnx_module_with_a_loss_trains_as_its_pure_function():
    """An NNX module (no unit_specs: zero3 runs it as one unit) with loss=, equal to the same module
    trained as a plain loss_fn on one device."""
    model = nnx.Linear(FEATURES, OUT, param_dtype=jnp.float64, rngs=nnx.Rngs(0))
    params = nnx.to_pure_dict(nnx.state(model, nnx.Param))

    def mse(out, y):
        return jnp.mean(jnp.sum((out - y) ** 2, -1))

    def plain(p, x, y):
        return mse(x @ p["kernel"] + p["bias"], y)

    results = []
    for fn, p, strategy, kw in ((model, None, "zero3", {"loss": mse}), (plain, params, "single", {})):
        par = jaxdp.parallelize(fn, p, optax.sgd(0.1), strategy=strategy, devices=3 if strategy == "zero3" else 1,
                                **kw)
        state = par.init()
        state, metrics = par.step(state, *batch(1))
        results.append((float(metrics["loss"]), par.params(state)))
    assert abs(results[0][0] - results[1][0]) < 1e-12
    for a, b in zip(jax.tree.leaves(results[0][1]), jax.tree.leaves(results[1][1]), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-12)


def parallelize(**kw):
    args = {"loss_fn": loss_fn, "params": initial_params(), "optimizer": optax.sgd(0.1), "strategy": "ddp",
            "devices": 2} | kw
    return jaxdp.parallelize(args.pop("loss_fn"), args.pop("params"), args.pop("optimizer"), **args)


@pytest.mark.parametrize(("kw", "message"), [
    ({"strategy": "ddp-fast"}, "unknown strategy 'ddp-fast'; valid: single, dp, ddp"),
    ({"bucket_mb": 1.0}, "strategy 'ddp' takes no option bucket_mb; its options: none"),
    ({"strategy": "zero3", "bucket_mb": 1.0}, "its options: collectives, reshard_after_forward"),
    ({"devices": 9}, "devices=9 but JAX has 8 cpu device(s); call jaxdp.setup_devices(9) first"),
    ({"strategy": "single"}, "strategy 'single' runs on one device, not 2: pass devices=1"),
    ({"accum": 0}, "accum=0; give a whole number of micro-batches >= 1"),
    ({"loss": jnp.mean}, "loss= is for an NNX module"),
    ({"devices": None, "mesh": jax.sharding.Mesh(np.array(jax.devices()[:2]), ("batch",))},
     "mesh axes ('batch',); strategies run on one axis named 'data'"),
])
def test_bad_arguments_are_one_line_naming_the_fix(kw, message):
    with pytest.raises(ConfigError, match=None) as info:
        parallelize(**kw)
    assert message in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize(("fma_off", "threads", "message"), [
    (False, "8", "needs XLA_FLAGS"),
    (True, None, "needs PJRT_NPROC set before JAX starts"),
    (True, "8", None),  # both, as setup_devices(n, reduction="canonical") gives them: accepted
])
def test_canonical_on_cpu_needs_fma_off_and_a_fixed_thread_pool(monkeypatch, fma_off, threads, message):
    """Either missing, one line naming setup_devices, before anything compiles (this session has neither:
    canonical's bits are checked in processes that start with both, tests/jaxdp/canonical/)."""
    monkeypatch.setattr(jaxdp_devices, "no_fma_flag_set", lambda: fma_off)
    monkeypatch.delenv(jaxdp_devices.THREADS_ENV, raising=False)
    if threads:
        monkeypatch.setenv(jaxdp_devices.THREADS_ENV, threads)
    if message is None:
        assert parallelize(reduction="canonical") is not None
        return
    with pytest.raises(ConfigError) as info:
        parallelize(reduction="canonical")
    text = str(info.value)
    assert message in text and "jaxdp.setup_devices(n, reduction='canonical')" in text and "\n" not in text


@pytest.mark.parametrize(("loss", "rows", "message"), [
    (lambda p, x, y: jnp.sum((forward(p, x) - y) ** 2, -1), 36, "the loss must be a scalar (the mean over the rows"),
    (loss_fn, 35, "a batch of 35 rows does not divide over 2 device(s) x accum 3 = 6; valid sizes near it: 30, 36"),
])
def test_bad_batches_and_losses_fail_before_compiling(loss, rows, message):
    par = parallelize(loss_fn=loss, accum=3)
    x, y = batch(1)
    with pytest.raises(ConfigError) as info:
        par.step(par.init(), x[:rows], y[:rows])
    assert message in str(info.value) and "\n" not in str(info.value)


def test_params_that_disagree_with_the_nnx_module_are_named():
    model = nnx.Linear(FEATURES, OUT, rngs=nnx.Rngs(0))
    for params, message in (({"kernel": np.zeros((FEATURES, OUT + 1)), "bias": np.zeros(OUT)},
                             "'kernel' has shape (5, 4), the module's (5, 3)"),
                            ({"kernel": np.zeros((FEATURES, OUT))}, "missing ['bias'], unexpected []")):
        with pytest.raises(ConfigError, match="params do not match Linear") as info:
            jaxdp.parallelize(model, params, optax.sgd(0.1), strategy="ddp", devices=2, loss=jnp.mean)
        assert message in str(info.value)


def test_a_shape_dependent_optimizer_is_named_under_zero_and_accepted_elsewhere():
    muon = optax.contrib.muon(0.01)
    for strategy in ("zero1", "fsdp"):  # one probe for every ZeRO stage
        with pytest.raises(ShapeDependentOptimizer, match=r"shape-dependent \(state types: MuonState"):
            parallelize(optimizer=muon, strategy=strategy)
    parallelize(optimizer=muon, strategy="ddp")  # true shapes: fine
    parallelize(optimizer=optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-3)), strategy="zero2")


def test_the_optimizers_jaxdp_builds_are_elementwise_so_zero_skips_their_probe(monkeypatch):
    """`optim.make`'s optimizers are marked `Elementwise` and not probed by `parallelize`; that trust is this
    test's: each of them, with weight decay and clipping, passes the probe on a (5, 7) kernel (padding over
    N = 3, where a shape-reading one differs) and a 2-D bias; the same chain unmarked is probed."""
    from jaxdp import optax_check, optim

    params = {"kernel": np.ones((5, 7), np.float32), "bias": np.ones((1, 3), np.float32)}
    for name in ("sgd", "momentum", "adam", "adamw"):
        made = optim.make(name, 1e-2, weight_decay=0.1, clip_norm=0.5)
        assert isinstance(made, optax_check.Elementwise), name
        check_elementwise(optax.GradientTransformationExtraArgs(*made), params, 3)  # probed: passes
    class Probed(Exception):
        pass

    def probe(*args):
        raise Probed
    monkeypatch.setattr(optax_check, "_updates", probe)
    parallelize(optimizer=optim.make("adamw", 1e-3, clip_norm=1.0), strategy="zero2")  # not probed
    with pytest.raises(Probed):
        parallelize(optimizer=optax.chain(optax.adamw(1e-3)), strategy="zero2")


@pytest.mark.parametrize("shape", [(256, 256), (5, 7)], ids=["factored-above-128", "padding-in-a-mean"])
def test_the_probe_sees_the_true_shapes(shape):
    """Adafactor factors matrices whose dimensions reach 128, and scales by each parameter's RMS (the
    padding of a (5, 7) kernel over N = 2 enters that mean): both differ on ZeRO's flat layout, so a
    probe on shrunken shapes would pass them silently."""
    with pytest.raises(ShapeDependentOptimizer, match="shape-dependent"):
        check_elementwise(optax.adafactor(1e-2), {"w": np.ones(shape, np.float32)}, 2)


SETUP = """
import sys, jaxdp, jaxdp.trace
assert "jax" not in sys.modules  # importing jaxdp starts nothing
print(len(jaxdp.setup_devices(3, "cpu")), jaxdp.trace.Recorder.__name__)
try:
    jaxdp.setup_devices(5)
except Exception as e:
    print(type(e).__name__, e)
"""


def test_setup_devices_in_a_fresh_process_and_its_error_once_jax_started():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", SETUP], capture_output=True, text=True, timeout=120)
    lines = out.stdout.splitlines()
    assert out.returncode == 0 and lines[0] == "3 Recorder", out.stderr
    assert lines[1].startswith("DeviceError --devices 5: JAX was already initialised with 3 CPU device(s)"), lines


class SharedSpecs(nnx.Module):
    """`a` used twice (its unit specs list it in two units, or, `mode` given, inconsistently)."""

    def __init__(self, mode: str = "shared"):
        self.a, self.b, self.mode = nnx.Linear(3, 3, rngs=nnx.Rngs(0)), nnx.Linear(3, 2, rngs=nnx.Rngs(1)), mode
        if mode == "alias":
            self.c = self.a  # one module at two attributes: nnx.state names it 'a' only

    def unit_specs(self):
        second = {"shared": ("a",), "inside": ("a", "kernel"), "alias": ("c",)}[self.mode]
        return [units.UnitSpec("first", (("a",),), lambda m, x: m(x)),
                units.UnitSpec("again", (second,), lambda m, x: x), units.UnitSpec("b", (("b",),), lambda m, x: m(x))]

    def __call__(self, x):
        return units.run(self, x)


@pytest.mark.parametrize(("mode", "message"), [
    ("inside", "SharedSpecs.unit_specs(): unit 'first' lists 'a' and unit 'again' 'a/kernel' inside it; a parameter "
               "shared by units must be listed by the same path in each (it goes to the root)"),
    ("alias", "SharedSpecs.unit_specs(): unit 'again' lists 'c', which is not in nnx.state(SharedSpecs)"),
])
def test_unit_specs_sharing_a_parameter_inconsistently_are_one_line(mode, message):
    problem = from_module(SharedSpecs(), lambda out, y: jnp.mean(out))  # listed by the same path: the root's
    assert units.shared_paths(problem.units) == (("a",),)
    with pytest.raises(ConfigError) as e:
        jaxdp.parallelize(SharedSpecs(mode), None, optax.sgd(0.1), strategy="zero3", devices=1,
                          loss=lambda out, y: jnp.mean(out))
    assert message in str(e.value) and "\n" not in str(e.value), str(e.value)
