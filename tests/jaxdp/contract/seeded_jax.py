"""Seeded misconfigurations in plain JAX, each written the way a user writes it (jax.jit, NamedSharding,
shard_map, optax), each with the public source of the mistake and the finding `jaxdp.check` must give
(docs/CHECK.md). `CASES`: name -> (build, intent keywords, the expected kind, source). `build(devices)` returns
(the jitted step, its arguments). Honest twins sit beside them (`HONEST`): the same code with the mistake
undone, which must pass."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

F, H, C, B = 16, 32, 8, 16  # features, hidden, classes, global batch


def init_params():
    k1, k2 = jax.random.split(jax.random.key(0))
    f32 = jnp.float32  # as written with JAX's default dtypes (the test suite runs with x64 enabled)
    return {"w1": jax.random.normal(k1, (F, H), f32) * 0.1, "b1": jnp.zeros(H, f32),
            "w2": jax.random.normal(k2, (H, C), f32) * 0.1, "b2": jnp.zeros(C, f32)}


def loss_fn(params, x, y):
    h = jnp.tanh(x @ params["w1"] + params["b1"])
    return optax.softmax_cross_entropy_with_integer_labels(h @ params["w2"] + params["b2"], y).mean()


def bf16_loss(params, x, y):
    """Mixed precision as it is usually written: compute in bf16 from the fp32 master."""
    p16 = jax.tree.map(lambda a: a.astype(jnp.bfloat16), params)
    return loss_fn(p16, x.astype(jnp.bfloat16), y).astype(jnp.float32)


def batch(mesh, spec):
    x = np.random.default_rng(0).normal(size=(B, F)).astype(np.float32)
    y = np.arange(B, dtype=np.int32) % C
    s = NamedSharding(mesh, spec)
    return jax.device_put(x, s), jax.device_put(y, s)


def train_step(loss, tx):
    def step(params, opt_state, x, y):
        grads = jax.grad(loss)(params, x, y)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state
    return step


def placed(mesh, params_spec, state_spec, tx, loss=loss_fn, batch_spec=None, dtype=None):
    """The step jitted with the shardings a user gives, and its arguments placed (the parameters cast to
    `dtype` first, if given, as a user casts a whole model)."""
    params = init_params() if dtype is None else jax.tree.map(lambda p: p.astype(dtype), init_params())
    p_sh = jax.tree.map(lambda a: NamedSharding(mesh, params_spec(a)), params)
    params = jax.device_put(params, p_sh)
    opt_state = tx.init(params)
    s_sh = jax.tree.map(lambda a: NamedSharding(mesh, state_spec(a) if a.ndim else P()), opt_state)
    opt_state = jax.device_put(opt_state, s_sh)
    step = jax.jit(train_step(loss, tx), out_shardings=(p_sh, s_sh), donate_argnums=(0, 1))
    return step, (params, opt_state, *batch(mesh, P("data") if batch_spec is None else batch_spec))


def rows(a):
    """Shard an array's first dimension over 'data' where it divides (ZeRO's layout), else replicate."""
    return P("data") if a.ndim and a.shape[0] % 4 == 0 else P()


def mesh1(devices):
    return Mesh(np.array(devices[:4]), ("data",))


def ddp(devices):
    return placed(mesh1(devices), lambda a: P(), lambda a: P(), optax.adamw(1e-3, weight_decay=0.01))


def bf16_reduce(devices):
    """bf16 compute from an fp32 master: the partitioner reduces the bf16 product (before the cast back)."""
    return placed(mesh1(devices), lambda a: P(), lambda a: P(), optax.adamw(1e-3, weight_decay=0.01), loss=bf16_loss)


def params_cast(devices, dtype=jnp.bfloat16):
    """The whole model cast to bf16 before the optimizer is built: the parameters and Adam's moments live in
    bf16, and updates below half a bf16 step of a weight round away."""
    return placed(mesh1(devices), lambda a: P(), lambda a: P(), optax.adamw(1e-3, weight_decay=0.01), dtype=dtype)


def params_kept_float32(devices):
    return params_cast(devices, jnp.float32)


def accumulate_in_scan(devices, k=4):
    """Gradient accumulation under jit: each micro-batch's gradient is a sum over sharded rows, so the
    partitioner reduces it inside the loop, k times per step."""
    tx, mesh = optax.adamw(1e-3, weight_decay=0.01), mesh1(devices)

    def step(params, opt_state, x, y):
        xs, ys = x.reshape(k, B // k, F), y.reshape(k, B // k)

        def micro(acc, xy):
            return jax.tree.map(jnp.add, acc, jax.grad(loss_fn)(params, *xy)), None
        grads, _ = jax.lax.scan(micro, jax.tree.map(jnp.zeros_like, params), (xs, ys))
        updates, opt_state = tx.update(jax.tree.map(lambda g: g / k, grads), opt_state, params)
        return optax.apply_updates(params, updates), opt_state
    params = jax.device_put(init_params(), NamedSharding(mesh, P()))
    opt_state = jax.device_put(tx.init(params), NamedSharding(mesh, P()))
    x, y = batch(mesh, P(None))
    xs = jax.device_put(x.reshape(k, B // k, F), NamedSharding(mesh, P(None, "data")))
    ys = jax.device_put(y.reshape(k, B // k), NamedSharding(mesh, P(None, "data")))
    return jax.jit(lambda p, s, x, y: step(p, s, x.reshape(B, F), y.reshape(B))), (params, opt_state, xs, ys)


def shard_map_2d(devices, axes):
    """DDP by hand on a ('replica', 'data') mesh, the batch split over both axes, the gradients pmean'd over
    `axes`."""
    mesh, tx = Mesh(np.array(devices[:4]).reshape(2, 2), ("replica", "data")), optax.sgd(0.1)

    def local(params, x, y):
        return jax.lax.pmean(jax.grad(loss_fn)(params, x, y), axes)
    both = P(("replica", "data"))
    grads_of = jax.shard_map(local, mesh=mesh, in_specs=(P(), both, both), out_specs=P(), check_vma=False)

    def step(params, opt_state, x, y):
        updates, opt_state = tx.update(grads_of(params, x, y), opt_state, params)
        return optax.apply_updates(params, updates), opt_state
    params = jax.device_put(init_params(), NamedSharding(mesh, P()))
    return jax.jit(step), (params, tx.init(params), *batch(mesh, both))


def wrong_axis(devices):
    """The gradients averaged over one axis of a 2-D mesh: the other axis's groups never meet."""
    return shard_map_2d(devices, "data")


def both_axes(devices):
    return shard_map_2d(devices, ("replica", "data"))


def zero1_state_replicated(devices):
    """ZeRO-1 meant, but the optimizer state initialised from replicated parameters and left replicated."""
    return placed(mesh1(devices), lambda a: P(), lambda a: P(), optax.adamw(1e-3, weight_decay=0.01))


def zero1(devices):
    return placed(mesh1(devices), lambda a: P(), rows, optax.adamw(1e-3, weight_decay=0.01))


def ddp_params_sharded(devices):
    """DDP meant, but the batch's sharding applied to every array, parameters included: FSDP by accident."""
    return placed(mesh1(devices), rows, rows, optax.adamw(1e-3, weight_decay=0.01))


def fsdp_params_replicated(devices):
    """FSDP meant, but the parameters' sharding names a dimension that does not divide (H x C = 32 x 8 over
    an axis of 4 does; the user sharded the *last* dimension of the biases and kept P() where it 'failed')."""
    return placed(mesh1(devices), lambda a: P(), rows, optax.adamw(1e-3, weight_decay=0.01))


def fsdp(devices):
    return placed(mesh1(devices), rows, rows, optax.adamw(1e-3, weight_decay=0.01))


def shard_map_step(devices, reduce):
    """DDP by hand with shard_map: local gradients (check_vma=False), then `reduce` them."""
    mesh, tx = mesh1(devices), optax.sgd(0.1)

    def local(params, x, y):
        return reduce(jax.grad(loss_fn)(params, x, y))
    grads_of = jax.shard_map(local, mesh=mesh, in_specs=(P(), P("data"), P("data")), out_specs=P(), check_vma=False)

    def step(params, opt_state, x, y):
        updates, opt_state = tx.update(grads_of(params, x, y), opt_state, params)
        return optax.apply_updates(params, updates), opt_state
    params = jax.device_put(init_params(), NamedSharding(mesh, P()))
    return jax.jit(step), (params, tx.init(params), *batch(mesh, P("data")))


def missing_pmean(devices):
    return shard_map_step(devices, lambda g: g)


def with_pmean(devices):
    return shard_map_step(devices, lambda g: jax.lax.pmean(g, "data"))


def double_pmean(devices):
    """shard_map with check_vma=True (the default): grad of replicated parameters is already summed over
    'data' (the implicit pcast's transpose); a pmean on top reduces a second time."""
    mesh, tx = mesh1(devices), optax.sgd(0.1)

    def local(params, x, y):
        return jax.lax.pmean(jax.grad(loss_fn)(params, x, y), "data")
    grads_of = jax.shard_map(local, mesh=mesh, in_specs=(P(), P("data"), P("data")), out_specs=P())

    def step(params, opt_state, x, y):
        updates, opt_state = tx.update(grads_of(params, x, y), opt_state, params)
        return optax.apply_updates(params, updates), opt_state
    params = jax.device_put(init_params(), NamedSharding(mesh, P()))
    return jax.jit(step), (params, tx.init(params), *batch(mesh, P("data")))


def hsdp_on_1d(devices):
    """HSDP meant (shard within groups, replicate across), but FSDP's 1-D mesh over all devices."""
    return fsdp(devices)


def hsdp_became_replication(devices):
    """HSDP meant on a ('replica', 'data') mesh under jit: parameters sharded over 'data', the batch over both
    axes; the partitioner all-reduces the whole gradient over all 4 devices instead."""
    mesh = Mesh(np.array(devices[:4]).reshape(2, 2), ("replica", "data"))
    return placed(mesh, lambda a: P("data") if a.ndim and a.shape[0] % 2 == 0 else P(),
                  lambda a: P("data") if a.ndim and a.shape[0] % 2 == 0 else P(),
                  optax.adamw(1e-3, weight_decay=0.01), batch_spec=P(("replica", "data")))


# name -> (build, intent keywords, the kind jaxdp.check must report first, the public source of the mistake)
CASES = {
    "bf16-product-reduced-before-the-fp32-cast": (bf16_reduce, {"intent": "ddp"}, "reduce-dtype",
                                                  "https://github.com/jax-ml/jax/issues/27496"),
    "accumulation-reducing-every-micro-batch": (accumulate_in_scan, {"intent": "ddp", "accumulation": 4},
                                                "sync-per-microbatch",
                                                "https://github.com/AI-Hypercomputer/maxtext/pull/5099"),
    "pmean-over-one-axis-of-a-2d-mesh": (wrong_axis, {"intent": "ddp"}, "wrong-axis",
                                         "https://github.com/NVIDIA-NeMo/Automodel/pull/3135"),
    "zero1-optimizer-state-left-replicated": (zero1_state_replicated, {"intent": "zero1"}, "state-replicated",
                                              "https://github.com/AI-Hypercomputer/maxtext/pull/5099"),
    "ddp-with-the-batch-sharding-on-the-parameters": (ddp_params_sharded, {"intent": "ddp"}, "unexpected-gather",
                                                      "https://github.com/NVIDIA/TransformerEngine/pull/2023"),
    "fsdp-whose-parameter-sharding-never-applied": (fsdp_params_replicated, {"intent": "zero3"},
                                                    "params-replicated",
                                                    "https://github.com/AI-Hypercomputer/maxtext/pull/556"),
    "gradients-never-averaged": (missing_pmean, {"intent": "ddp"}, "no-gradient-sync",
                                 "https://github.com/HenryNdubuaku/nanodl/issues/12"),
    "pmean-on-top-of-shard_map-implicit-psum": (double_pmean, {"intent": "ddp"}, "extra-gradient-sync",
                                                "https://github.com/jax-ml/jax/issues/19175"),
    "hsdp-on-a-1d-mesh": (hsdp_on_1d, {"intent": "hsdp"}, "wrong-axis",
                          "https://github.com/meta-pytorch/tnt/pull/1077"),
    "hsdp-2d-mesh-became-replication": (hsdp_became_replication, {"intent": "hsdp"}, "wrong-axis",
                                        "https://github.com/pytorch/pytorch/issues/154888"),
    "params-cast-to-bf16-before-the-optimizer": (params_cast, {"intent": "ddp"}, "master-dtype",
                                                 "https://github.com/keras-team/keras-hub/issues/2629"),
}
# the same code with the mistake undone: must pass
HONEST = {"ddp": (ddp, {"intent": "ddp"}), "pmean": (with_pmean, {"intent": "ddp"}),
          "pmean-over-both-axes": (both_axes, {"intent": "ddp"}), "zero1": (zero1, {"intent": "zero1"}),
          "fsdp": (fsdp, {"intent": "zero3"}), "params-kept-float32": (params_kept_float32, {"intent": "ddp"})}
