"""Port a Hugging Face model: a transformers GPT-2 and Llama, built from small configs (nothing is
downloaded), converted to jaxdp's own `GPT2` and `Llama` with no hand-written name map, trained in
both frameworks under one strategy (zero3 by default: FSDP2 on the torch side) and diffed.

    python examples/port_hf_model.py [--model gpt2|llama|both] [--strategy zero3] [--devices 4]
                                     [--steps 3] [--plant-bug] [--quick]

The torch run trains the transformers model itself (`torch_ref.parallelize`, recorded with
`torch_ref.trace.Recorder(..., strip_prefix=...)`); the JAX run trains `jaxdp.models.GPT2` / `Llama`
started from the transformers model's own initial weights (`torch_ref.convert.to_flax(...,
strip_prefix=...)`), so both start bit for bit equal. AdamW, as everyone trains these models.
`--plant-bug` adds 1e-3 to the final norm's weight of the torch run after step 2: the diff must name
step 2, `param`, that tensor, and nothing before it. Exit status: 0 when every model's two runs
agree within the parity bounds, 1 when one does not (as `jaxdp diff`). Needs `pip install -e ".[hf]"`.
"""
import argparse
import os
import sys

import numpy as np

VOCAB, SEQ, D_MODEL, N_LAYER, N_HEAD, N_KV_HEAD, D_FF = 96, 16, 64, 2, 4, 2, 128
LR, WEIGHT_DECAY, CLIP = 1e-3, 0.01, 1.0
BUG_STEP = 2
# Strategies both parallelize()s take with no further options (hsdp also needs its replicas).
STRATEGIES = ("dp", "ddp", "ddp-bucket", "ddp-ring", "zero1", "zero2", "zero3", "fsdp")
# Each model: its transformers class, the prefix of its backbone's names, the tensor the bug hits.
PREFIX = {"gpt2": "transformer.", "llama": "model."}
BUG = {"gpt2": "transformer.ln_f.weight", "llama": "model.norm.weight"}
DTYPE = {"gpt2": "float64", "llama": "float32"}  # why float32 for Llama: see `hf_model`


def hf_model(name: str):
    """The transformers model from a small config, eager attention, no dropout, in its run dtype.

    Llama runs in float32: transformers computes the rotary angles in float32 whatever the model's
    dtype, so a float64 Llama from transformers is float32 in its position encoding, and a float64
    diff against a float64 model would (rightly) flag it (docs/LIBRARY.md, "Port a Hugging Face model")."""
    import torch
    import transformers as hf

    torch.manual_seed(0)
    if name == "gpt2":  # GPT-2's begin/end token is 50256, outside this small vocabulary: the last id instead
        # (transformers warns, six times, that its config's ids lie outside the vocabulary otherwise)
        config = hf.GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=D_MODEL, n_layer=N_LAYER, n_head=N_HEAD,
                               resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, attn_implementation="eager",
                               bos_token_id=VOCAB - 1, eos_token_id=VOCAB - 1)
        model = hf.GPT2LMHeadModel(config)
    else:
        config = hf.LlamaConfig(vocab_size=VOCAB, max_position_embeddings=SEQ, hidden_size=D_MODEL,
                                num_hidden_layers=N_LAYER, num_attention_heads=N_HEAD, num_key_value_heads=N_KV_HEAD,
                                intermediate_size=D_FF, attn_implementation="eager")
        model = hf.LlamaForCausalLM(config)
    return model.to(getattr(torch, DTYPE[name]))


def jax_model(name: str):
    """jaxdp's own model with the same shape: what the transformers weights load into, by name."""
    import jax.numpy as jnp
    from flax import nnx

    import jaxdp.models

    dtype = getattr(jnp, DTYPE[name])
    kw = dict(vocab=VOCAB, seq_len=SEQ, n_layer=N_LAYER, n_head=N_HEAD, d_model=D_MODEL, param_dtype=dtype,
              dtype=dtype, rngs=nnx.Rngs(0))
    if name == "gpt2":
        return jaxdp.models.GPT2(**kw)
    return jaxdp.models.Llama(n_kv_head=N_KV_HEAD, d_ff=D_FF, **kw)


def batches(steps: int, batch: int, seed: int = 0):
    """Next-token batches both frameworks see: x the tokens, y the same shifted by one."""
    rng = np.random.default_rng(seed)
    tokens = [rng.integers(0, VOCAB, size=(batch, SEQ + 1)) for _ in range(steps)]
    return [(t[:, :-1], t[:, 1:]) for t in tokens]


def meta(args, name, framework):
    """The run's description; the optimizer's settings come from the Recorders' `optimizer=` (clipping is
    the training step's, so `clip_norm` is here)."""
    return {"framework": framework, "model": f"hf-{name}", "dtype": DTYPE[name], "clip_norm": CLIP,
            "strategy": args.strategy, "devices": args.devices, "steps": args.steps, "batch_size": args.batch_size}


# ---- JAX ----------------------------------------------------------------------------------------------
def jax_run(args, name, init, data, path):
    """jaxdp's model, started from the transformers weights, trained through jaxdp.parallelize."""
    import jax
    import optax

    import jaxdp
    from jaxdp.models import cross_entropy
    from jaxdp.optim import clip_grad_norm

    optimizer = optax.chain(clip_grad_norm(CLIP), optax.adamw(LR, b1=0.9, b2=0.999, eps=1e-8,
                                                               weight_decay=WEIGHT_DECAY))
    par = jaxdp.parallelize(jax_model(name), init, optimizer, strategy=args.strategy, devices=args.devices,
                            loss=cross_entropy, return_grads=True)
    state = par.init()
    settings = {"name": "adamw", "lr": LR, "weight_decay": WEIGHT_DECAY}  # optax does not expose them
    with jaxdp.trace.Recorder(path, meta(args, name, "jax"), optimizer=settings) as rec:
        rec.init(init)
        for k, (x, y) in enumerate(data, start=1):
            state, metrics = par.step(state, x, y)
            rec.step(k, metrics["loss"], metrics["grads"], par.params(state), x, y)
    jax.clear_caches()


# ---- torch --------------------------------------------------------------------------------------------
def torch_ranks(rank, world, args, names, data, paths):
    """One rank of the torch world: each model in turn (one world for all, its start paid once)."""
    for name, path in zip(names, paths, strict=True):
        torch_rank(rank, world, args, name, data, path)


def torch_rank(rank, world, args, name, data, path):
    """One rank: the transformers model itself, parallelized, trained and recorded in Flax names."""
    import torch
    import torch.nn.functional as F

    import torch_ref

    def loss_fn(out, y):  # transformers returns an output object; its logits are [batch, seq, vocab]
        return F.cross_entropy(out.logits.flatten(0, 1), y.flatten())

    model, optimizer = torch_ref.parallelize(
        hf_model(name), strategy=args.strategy,
        optimizer=lambda ps: torch.optim.AdamW(ps, lr=LR, weight_decay=WEIGHT_DECAY))
    rows = slice(rank * args.batch_size // world, (rank + 1) * args.batch_size // world)
    with torch_ref.trace.Recorder(path, meta(args, name, "torch"), model, strip_prefix=PREFIX[name],
                                  optimizer=optimizer) as rec:
        rec.init()
        for k, (x, y) in enumerate(data, start=1):
            loss = torch_ref.train_step(model, optimizer, torch.from_numpy(x[rows]), torch.from_numpy(y[rows]),
                                        loss_fn, clip_norm=CLIP)
            if args.plant_bug and k == BUG_STEP:
                plant_bug(model, name)
            rec.step(k, loss, x, y)


def plant_bug(model, name):
    """The bug a port might have: one stray in-place write to one tensor at one step."""
    import torch

    with torch.no_grad():
        for pname, p in model.named_parameters():
            if pname.endswith(BUG[name]):
                p.add_(1e-3)


# ---- both, and the diff ---------------------------------------------------------------------------------
def paths(args, name) -> tuple[str, str]:
    return tuple(os.path.join(args.out, f"{name}-{f}.npz") for f in ("torch", "jax"))


def report(args, name) -> bool:
    """The diff of one model's two runs, printed as `jaxdp diff` prints it. True when they agree."""
    import jaxdp

    torch_path, jax_path = paths(args, name)
    diff = jaxdp.diff(torch_path, jax_path)
    print(f"== {name} ({DTYPE[name]}, {args.strategy}, N = {args.devices}, {args.steps} steps): "
          f"transformers' model in torch_ref (A) against jaxdp.models.{'GPT2' if name == 'gpt2' else 'Llama'} (B)")
    print(diff.text())
    return diff.ok


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--model", choices=("gpt2", "llama", "both"), default="both",
                        help="which transformers model to port")
    parser.add_argument("--strategy", choices=STRATEGIES, default="zero3",
                        help="the data-parallel strategy of both runs")
    parser.add_argument("--devices", type=positive, default=4, help="simulated CPU devices (JAX) and ranks (torch)")
    parser.add_argument("--steps", type=positive, default=3, help="AdamW steps of each run")
    parser.add_argument("--batch-size", type=positive, default=8, help="global batch of sequences, a multiple of "
                        "--devices")
    parser.add_argument("--plant-bug", action="store_true",
                        help=f"perturb the torch run's final norm weight after step {BUG_STEP}")
    parser.add_argument("--quick", action="store_true", help="2 devices, 2 steps")
    parser.add_argument("--out", default="reports/port_hf", help="folder for the two traces")
    args = parser.parse_args()
    if args.quick:
        args.devices, args.steps = 2, 2
    if args.batch_size % args.devices:
        parser.error(f"--batch-size {args.batch_size} must be a multiple of --devices {args.devices}")
    if args.plant_bug and args.steps < BUG_STEP:
        parser.error(f"--plant-bug perturbs after step {BUG_STEP}: give --steps {BUG_STEP} or more")
    try:
        import transformers  # noqa: F401
    except ImportError:
        parser.error('transformers is not installed: pip install -e ".[hf]"')
    os.makedirs(args.out, exist_ok=True)

    import jax

    import jaxdp

    jax.config.update("jax_enable_x64", True)
    jaxdp.setup_devices(args.devices, "cpu")
    from torch_ref import convert, launch

    names = ("gpt2", "llama") if args.model == "both" else (args.model,)
    data = batches(args.steps, args.batch_size)
    for name in names:  # no map: names and layouts by convert's rules
        jax_run(args, name, convert.to_flax(hf_model(name), strip_prefix=PREFIX[name]), data, paths(args, name)[1])
    launch.launch(torch_ranks, args.devices, args, names, data, [paths(args, n)[0] for n in names],
                  platform="cpu", timeout_s=600)
    ok = [report(args, name) for name in names]
    return 0 if all(ok) else 1


if __name__ == "__main__":  # the spawned torch ranks import this file again
    sys.exit(main())
