"""Copy me: your own jitted JAX data-parallel step, checked against what you meant (docs/CHECK.md).

    jaxdp check examples/check_jax.py:make --devices 2 --intent ddp
    jaxdp check examples/check_jax.py:make_bf16_params --devices 2 --intent ddp

`make(devices)` returns (step, args): the jitted step and its arguments placed with the shardings your
training script gives them (the parameters and AdamW's state replicated, the batch split over 'data'). The
check compiles the step and reads every collective of the program: one float32 all-reduce of the gradients
per step (exit 0). `make_bf16_params` casts the whole model to bf16 before building the optimizer: the
parameters and Adam's moments have no float32 master (exit 1, finding master-dtype).
"""
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P


def loss(params, x, y):
    h = jnp.tanh(x @ params["w1"] + params["b1"])
    return optax.softmax_cross_entropy_with_integer_labels(h @ params["w2"], y).mean()


def build(devices, dtype=jnp.float32):
    mesh = Mesh(np.array(devices), ("data",))
    k1, k2 = jax.random.split(jax.random.key(0))
    params = {"w1": jax.random.normal(k1, (16, 32), jnp.float32) * 0.1, "b1": jnp.zeros(32, jnp.float32),
              "w2": jax.random.normal(k2, (32, 8), jnp.float32) * 0.1}
    params = jax.tree.map(lambda p: p.astype(dtype), params)
    params = jax.device_put(params, NamedSharding(mesh, P()))  # replicated: ddp
    tx = optax.adamw(1e-3, weight_decay=0.01)
    opt_state = tx.init(params)
    rows = NamedSharding(mesh, P("data"))  # the batch split over the devices
    x = jax.device_put(np.random.default_rng(0).normal(size=(8 * len(devices), 16)).astype(np.float32), rows)
    y = jax.device_put((np.arange(8 * len(devices)) % 8).astype(np.int32), rows)

    @jax.jit
    def step(params, opt_state, x, y):
        grads = jax.grad(loss)(params, x, y)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state
    return step, (params, opt_state, x, y)


def make(devices):
    return build(devices)


def make_bf16_params(devices):
    return build(devices, jnp.bfloat16)



if __name__ == "__main__":  # python examples/check_jax.py [--function F]: the same as the jaxdp check lines above
    from jaxdp.harness.cli import check_example

    check_example(__file__, ("make", "make_bf16_params"), "--intent", "ddp")
