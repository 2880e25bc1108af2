"""Train an MLP on scikit-learn's 8x8 digits with several strategies on 4 simulated devices and show
that they train identically (same losses to the last digits) and reach the same accuracy.

    python examples/train_mlp_digits.py [--quick]
"""
import argparse

import numpy as np

from jaxdp import devices, train
from jaxdp.core.config import RunConfig


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="a few steps only (smoke test)")
    args = parser.parse_args()
    devices.setup(4)  # 4 simulated CPU devices, before JAX starts

    steps = 10 if args.quick else 300
    base = RunConfig(model="mlp", data="digits", hidden=(64, 64), devices=4, steps=steps, batch_size=128,
                     optimizer="adam", lr=3e-3, dtype="float32", seed=0)
    print(f"mlp 64-64-10 on digits, adam, {steps} steps of 128 images, 4 devices")
    results = {}
    for strategy in ("ddp", "ddp-ring", "zero2", "zero3"):
        r = train.run(base.replace(strategy=strategy), record=True, progress=False)
        results[strategy] = r
        print(f"  {strategy:<9} loss {r.losses[0]:.3f} -> {r.losses[-1]:.3f}  ({r.steps_per_s:.0f} steps/s)")

    ref = np.array(results["ddp"].losses)
    for strategy, r in results.items():
        print(f"  {strategy:<9} max |loss - ddp loss| over all steps: {np.max(np.abs(np.array(r.losses) - ref)):.1e}")

    # Accuracy of zero3's final parameters (read back from its trace) on all 1797 images.
    from jaxdp import models
    from jaxdp.core import data  # noqa: E402

    dataset = data.load("digits", 0)
    problem = models.init(base, dataset)
    final = {name: results["zero3"].arrays[f"step/{steps}/param/{name}"] for name in models.flat_names(problem.params)}
    logits = problem.apply(models.unflatten_names(final), dataset._inputs.astype(np.float32))
    accuracy = float(np.mean(np.argmax(np.asarray(logits), -1) == dataset._labels))
    print(f"zero3's final parameters classify {accuracy:.1%} of the digits correctly")


if __name__ == "__main__":  # spawned torch ranks re-import this file
    main()
