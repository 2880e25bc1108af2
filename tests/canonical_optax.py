"""A user's optimizer under `reduction="canonical"`, for tests/jaxdp/canonical/test_compiler.py: an mlp through
`jaxdp.parallelize` with an optax `multi_transform` (Adam on the biases, AdamW on the kernels: the biases' bias
corrections reach two leaves of 16 and 10 elements, one padded length on ZeRO's flat layout), 3 steps on `single`,
ddp at N = 4, zero1 at N = 4, zero3 at N = 2 and 8. Started for canonical (fused multiply-adds off).

    python -m tests.canonical_optax [--simplifier-on]

Prints one JSON line: {"options": the compiler options chosen, "differ": {"strategy@N": [leaves unequal to
single's]}}. `--simplifier-on`: the mutation, `compiler_options` forced to the simplifier on.
"""
from __future__ import annotations

import json
import sys


def main(argv) -> None:
    import jaxdp

    jaxdp.setup_devices(8, "cpu", reduction="canonical")
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax

    from jaxdp.canonical import compiler

    if "--simplifier-on" in argv:
        compiler.compiler_options = lambda params, optimizer=None: compiler.COMPILER_OPTIONS
    rng = np.random.default_rng(0)
    params = {name: {"kernel": rng.standard_normal(shape).astype(np.float32) * 0.3,
                     "bias": np.zeros(shape[1], np.float32)} for name, shape in (("l0", (12, 16)), ("l1", (16, 10)))}

    def loss_fn(p, x, y):
        logits = jnp.tanh(x @ p["l0"]["kernel"] + p["l0"]["bias"]) @ p["l1"]["kernel"] + p["l1"]["bias"]
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
    labels = {layer: {"kernel": "kernel", "bias": "bias"} for layer in params}
    opt = optax.multi_transform({"bias": optax.adam(0.05), "kernel": optax.adamw(0.01, weight_decay=0.01)}, labels)
    x, y = rng.standard_normal((64, 12)).astype(np.float32), rng.integers(0, 10, 64)
    out = {}
    for strategy, n in (("single", 1), ("ddp", 4), ("zero1", 4), ("zero3", 2), ("zero3", 8)):
        par = jaxdp.parallelize(loss_fn, params, opt, strategy=strategy, devices=n, reduction="canonical", shards=8)
        state = par.init()
        for _ in range(3):
            state, _ = par.step(state, x, y)
        out[f"{strategy}@{n}"] = {jax.tree_util.keystr(k): np.asarray(v)
                                  for k, v in jax.tree.flatten_with_path(par.params(state))[0]}
    ref = out.pop("single@1")
    differ = {name: [k for k in ref if not np.array_equal(ref[k], got[k])] for name, got in out.items()}
    print(json.dumps({"options": compiler.compiler_options(params, opt), "differ": differ}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
