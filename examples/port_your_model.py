"""Check a port step by step: one small model written twice, in JAX (Flax NNX) and in PyTorch,
trained through `jaxdp.parallelize` and `torch_ref.parallelize` under a data-parallel strategy,
recorded with the two trace recorders, and diffed. The report names the first divergence: the
first step, field and tensor where the two runs part, with the worst element.

    python examples/port_your_model.py [--strategy zero2] [--devices 2] [--steps 4] [--plant-bug] [--quick]

`--plant-bug` adds 1e-3 to one tensor (the LayerNorm's bias) of the torch run after step 2: the
diff must name step 2, `param`, `norm/bias`, and nothing before it. Exit status: 0 when the two
runs agree within the parity bounds, 1 when they do not (as `jaxdp diff`). The torch ranks are
spawned here; under torchrun, write the torch half as `torch_rank` does.
"""
import argparse
import json
import os
import sys

import numpy as np

D_IN, D_HIDDEN, D_OUT = 8, 16, 4
LR, WEIGHT_DECAY, CLIP = 1e-2, 0.01, 1.0
EPS = 1e-5  # LayerNorm epsilon: torch's default is 1e-5, Flax's 1e-6. Say it on both sides.
BUG_STEP = 2
# Strategies both parallelize()s take with no further options (hsdp also needs its replicas).
STRATEGIES = ("dp", "ddp", "ddp-bucket", "ddp-ring", "zero1", "zero2", "zero3", "fsdp")


def batches(steps: int, batch: int, seed: int = 0):
    """The global batches both frameworks see: [(x, y)] as NumPy, float64 inputs, int labels."""
    rng = np.random.default_rng(seed)
    return [(rng.normal(size=(batch, D_IN)), rng.integers(0, D_OUT, size=batch)) for _ in range(steps)]


# ---- the model in JAX -------------------------------------------------------------------------------
def jax_model():
    import jax.numpy as jnp
    from flax import nnx

    class TinyNet(nnx.Module):
        def __init__(self, rngs):
            kw = dict(param_dtype=jnp.float64, dtype=jnp.float64, rngs=rngs)
            self.fc1 = nnx.Linear(D_IN, D_HIDDEN, **kw)
            self.norm = nnx.LayerNorm(D_HIDDEN, epsilon=EPS, **kw)
            self.fc2 = nnx.Linear(D_HIDDEN, D_OUT, use_bias=False, **kw)

        def __call__(self, x):
            return self.fc2(jnp.tanh(self.norm(self.fc1(x))))

    return TinyNet(nnx.Rngs(0))


def jax_run(args, data, path):
    """Train the NNX model through jaxdp.parallelize and record its trace; returns the initial params."""
    import jax
    import optax
    from flax import nnx

    import jaxdp
    from jaxdp.optim import clip_grad_norm

    jax.config.update("jax_enable_x64", True)
    model = jax_model()
    init = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    # torch's AdamW and clip_grad_norm_ (whose +1e-6 optax.clip_by_global_norm lacks): the same rule.
    optimizer = optax.chain(clip_grad_norm(CLIP), optax.adamw(LR, b1=0.9, b2=0.999, eps=1e-8,
                                                               weight_decay=WEIGHT_DECAY))
    par = jaxdp.parallelize(model, None, optimizer, strategy=args.strategy, devices=args.devices,
                            accum=args.accum, loss=cross_entropy_jax, return_grads=True)
    state = par.init()
    # optax does not expose its settings: record them (`jaxdp diff` replays them on the gradients)
    settings = {"name": "adamw", "lr": LR, "weight_decay": WEIGHT_DECAY, "clip_norm": CLIP}
    with jaxdp.trace.Recorder(path, meta(args, "jax"), optimizer=settings) as rec:
        rec.init(init)
        for k, (x, y) in enumerate(data, start=1):
            state, metrics = par.step(state, x, y)
            rec.step(k, metrics["loss"], metrics["grads"], par.params(state), x, y)
    return jax.tree.map(np.asarray, init)


def cross_entropy_jax(logits, y):
    import optax

    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()


# ---- the model in PyTorch ---------------------------------------------------------------------------
def torch_model():
    from torch import nn

    class TinyNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(D_IN, D_HIDDEN)
            self.norm = nn.LayerNorm(D_HIDDEN, eps=EPS)
            self.fc2 = nn.Linear(D_HIDDEN, D_OUT, bias=False)

        def forward(self, x):
            return self.fc2(self.norm(self.fc1(x)).tanh())

    return TinyNet().double()


def torch_rank(rank, world, args, data, init, path):
    """One rank of the torch run (the process group is up): the port, trained and recorded."""
    import torch
    import torch.nn.functional as F

    import torch_ref
    from torch_ref import convert

    model = convert.load_flax(torch_model(), init)  # the JAX run's initial weights, bit for bit
    model, optimizer = torch_ref.parallelize(
        model, strategy=args.strategy, accum=args.accum,
        optimizer=lambda ps: torch.optim.AdamW(ps, lr=LR, weight_decay=WEIGHT_DECAY))
    rows = slice(rank * args.batch_size // world, (rank + 1) * args.batch_size // world)
    # the optimizer's settings from its param_groups; clipping is train_step's: clip_norm in meta
    with torch_ref.trace.Recorder(path, {**meta(args, "torch"), "clip_norm": CLIP}, model, optimizer=optimizer) as rec:
        rec.init()
        for k, (x, y) in enumerate(data, start=1):
            loss = torch_ref.train_step(model, optimizer, torch.from_numpy(x[rows]), torch.from_numpy(y[rows]),
                                        F.cross_entropy, clip_norm=CLIP)
            if args.plant_bug and k == BUG_STEP:
                plant_bug(model)
            rec.step(k, loss, x, y)


def plant_bug(model):
    """The bug a port might have: one stray in-place write to one tensor at one step."""
    import torch

    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.bias"):
                p.add_(1e-3)


# ---- both, and the diff -----------------------------------------------------------------------------
def meta(args, framework):
    """The run's description; the optimizer's settings come from the Recorders' `optimizer=`."""
    return {"framework": framework, "model": "tinynet", "dtype": "float64", "strategy": args.strategy,
            "devices": args.devices, "accum": args.accum, "steps": args.steps, "batch_size": args.batch_size}


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--strategy", choices=STRATEGIES, default="zero2",
                        help="the data-parallel strategy of both runs")
    parser.add_argument("--devices", type=positive, default=2, help="simulated CPU devices (JAX) and ranks (torch)")
    parser.add_argument("--accum", type=positive, default=1, help="gradient-accumulation micro-batches per step")
    parser.add_argument("--steps", type=positive, default=4, help="optimizer steps of each run")
    parser.add_argument("--batch-size", type=positive, default=24, help="global batch, a multiple of --devices x "
                        "--accum")
    parser.add_argument("--plant-bug", action="store_true", help=f"perturb one torch tensor after step {BUG_STEP}")
    parser.add_argument("--quick", action="store_true", help=f"{BUG_STEP + 1} steps (a smoke run)")
    parser.add_argument("--out", default="reports/port", help="folder for the two traces and the diff's page")
    args = parser.parse_args()
    if args.quick:
        args.steps = BUG_STEP + 1
    if args.batch_size % (args.devices * args.accum):
        parser.error(f"--batch-size {args.batch_size} must be a multiple of --devices x --accum = "
                     f"{args.devices * args.accum}")
    if args.plant_bug and args.steps < BUG_STEP:
        parser.error(f"--plant-bug perturbs after step {BUG_STEP}: give --steps {BUG_STEP} or more")
    os.makedirs(args.out, exist_ok=True)
    jax_path, torch_path = (os.path.join(args.out, f"{f}.npz") for f in ("jax", "torch"))

    import jaxdp

    jaxdp.setup_devices(args.devices, "cpu")
    data = batches(args.steps, args.batch_size)
    init = jax_run(args, data, jax_path)
    print(f"jax:   {args.strategy} on {args.devices} device(s), {args.steps} steps -> {jax_path}")

    from torch_ref import launch

    launch.launch(torch_rank, args.devices, args, data, init, torch_path, platform="cpu", timeout_s=300)
    print(f"torch: {args.strategy} on {args.devices} rank(s), {args.steps} steps -> {torch_path}")

    from jaxdp.harness.report import diff_html

    verdict = jaxdp.diff(torch_path, jax_path)  # the Verdict `jaxdp diff torch.npz jax.npz` prints
    with open(os.path.join(args.out, "diff.json"), "w") as f:
        json.dump(verdict.to_json(), f, indent=1)
    with open(os.path.join(args.out, "diff.html"), "w") as f:
        f.write(diff_html.page(verdict.report, torch_path, jax_path))
    if verdict.first is None:
        word = "ok" if verdict.ok else "FAIL"
        print(f"torch and jax agree at every step and tensor within the float64 parity bounds ({word})")
    else:
        print(f"first divergence: {verdict.first.describe()}")
    print(f"details: {args.out}/diff.html, {args.out}/diff.json")
    return 0 if verdict.ok else 1


if __name__ == "__main__":  # the spawned torch ranks import this file again
    sys.exit(main())
