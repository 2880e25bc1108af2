"""Train the character-level GPT on the text shipped with jaxdp, fully sharded (zero3 / FSDP) over
4 simulated devices, then show what sharding saved per device and a greedy continuation of a prompt
written by the trained model.

    python examples/train_gpt_text.py [--quick] [--chars 120]

`--quick` trains a tiny model for 30 steps: its continuation is real (new characters the model chose),
but such a model babbles; the full run (400 steps, a larger model) writes words.
"""
import argparse

import numpy as np

from jaxdp import devices, models, train
from jaxdp.analysis import accounting
from jaxdp.core.run import data
from jaxdp.core.run.config import RunConfig

PROMPT = "Each device "


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def continuation(cfg, params, dataset, prompt: str, n: int) -> str:
    """`n` characters the model writes after `prompt`, each the most likely next one (greedy)."""
    import jax

    problem = models.init(cfg, dataset)
    apply = jax.jit(problem.apply)
    lookup = {c: i for i, c in enumerate(dataset.vocab)}
    text = prompt
    for _ in range(n):
        window = [lookup[c] for c in text[-cfg.seq_len :]]
        window = [window[0]] * (cfg.seq_len - len(window)) + window
        logits = np.asarray(apply(params, np.array([window], dtype=np.int32)))
        text += dataset.vocab[int(np.argmax(logits[0, -1]))]
    return text[len(prompt) :]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a tiny model, 30 steps (smoke test)")
    parser.add_argument("--chars", type=positive, default=None,
                        help="characters to generate (None: 120, or 40 with --quick)")
    args = parser.parse_args()
    devices.setup(4)

    steps = 30 if args.quick else 400
    chars = args.chars or (40 if args.quick else 120)
    size = dict(n_layer=1, n_head=2, d_model=32) if args.quick else dict(n_layer=2, n_head=4, d_model=64)
    cfg = RunConfig(model="gpt", data="text", strategy="zero3", devices=4, steps=steps, batch_size=32, seq_len=32,
                    optimizer="adamw", lr=3e-3, weight_decay=0.01, clip_norm=1.0, dtype="float32", seed=0, **size)
    result = train.run(cfg, record=True, progress=not args.quick)
    print(f"gpt ({cfg.n_layer} layers, d_model {cfg.d_model}) with zero3 on 4 devices: "
          f"loss {result.losses[0]:.3f} -> {result.losses[-1]:.3f} in {steps} steps")

    for strategy in ("ddp", "zero3"):
        m = accounting.memory(cfg.replace(strategy=strategy, steps=1), temporaries=False)["measured"]
        print(
            f"  {strategy:<6} holds per device: params {m['params'] / 1024:6.1f} KiB, "
            f"grads {m['grads'] / 1024:6.1f} KiB, "
            f"Adam state {m['opt_state'] / 1024:6.1f} KiB"
        )

    # Greedy continuation from the trained parameters (read back from the trace).
    dataset = data.load("text", cfg.seed, cfg.seq_len)
    names = models.flat_names(models.init(cfg, dataset).params)
    params = models.unflatten_names({n: result.arrays[f"step/{steps}/param/{n}"] for n in names})
    new = continuation(cfg, params, dataset, PROMPT, chars)
    print(f"prompt:       {PROMPT!r}")
    print(f"continuation: {new!r} ({len(new)} new characters, greedy)")
    if args.quick:
        print(f"  (a {steps}-step model babbles: it repeats what is most common in the text; "
              "run without --quick for 400 steps of a larger model)")


if __name__ == "__main__":  # spawned torch ranks re-import this file
    main()
