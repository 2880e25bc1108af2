"""Train the character-level GPT on the text shipped with jaxdp, fully sharded (zero3 / FSDP) over
4 simulated devices, then show what sharding saved per device and a sample of what it learned.

    python examples/train_gpt_text.py [--quick]
"""
import argparse

import numpy as np

from jaxdp import devices, models, train
from jaxdp.analysis import accounting
from jaxdp.core import data
from jaxdp.core.config import RunConfig


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="a few steps only (smoke test)")
    args = parser.parse_args()
    devices.setup(4)

    steps = 5 if args.quick else 400
    size = dict(n_layer=1, n_head=2, d_model=32) if args.quick else dict(n_layer=2, n_head=4, d_model=64)
    cfg = RunConfig(model="gpt", data="text", strategy="zero3", devices=4, steps=steps, batch_size=32, seq_len=32,
                    optimizer="adamw", lr=3e-3, weight_decay=0.01, clip_norm=1.0, dtype="float32", seed=0, **size)
    result = train.run(cfg, record=True, progress=not args.quick)
    print(f"gpt ({cfg.n_layer} layers, d_model {cfg.d_model}) with zero3 on 4 devices: "
          f"loss {result.losses[0]:.3f} -> {result.losses[-1]:.3f} in {steps} steps")

    for strategy in ("ddp", "zero3"):
        m = accounting.memory(cfg.replace(strategy=strategy, steps=1))["measured"]
        print(
            f"  {strategy:<6} holds per device: params {m['params'] / 1024:6.1f} KiB, "
            f"grads {m['grads'] / 1024:6.1f} KiB, "
            f"Adam state {m['opt_state'] / 1024:6.1f} KiB"
        )

    # Greedy sampling from the trained parameters (read back from the trace).
    dataset = data.load("text", cfg.seed, cfg.seq_len)
    problem = models.init(cfg, dataset)
    params = models.unflatten_names(
        {n: result.arrays[f"step/{steps}/param/{n}"] for n in models.flat_names(problem.params)}
    )
    lookup = {c: i for i, c in enumerate(dataset.vocab)}
    text = "Each device "
    for _ in range(0 if args.quick else 120):
        window = [lookup[c] for c in text[-cfg.seq_len :]]
        window = [window[0]] * (cfg.seq_len - len(window)) + window
        logits = np.asarray(problem.apply(params, np.array([window], dtype=np.int32)))
        text += dataset.vocab[int(np.argmax(logits[0, -1]))]
    print("sample:", repr(text))


if __name__ == "__main__":  # spawned torch ranks re-import this file
    main()
