"""Train an MLP on scikit-learn's 8x8 digits with several strategies on 4 simulated devices and show
that they train identically: ddp, zero2 and zero3 give bit for bit the same losses at every step and
the same final parameters; ddp-ring, which adds the devices' gradients in ring order rather than XLA's,
differs by float32 rounding (about 1e-7); so all reach the same accuracy. Each is printed against ddp.

    python examples/train_mlp_digits.py [--quick]

`--quick` trains 10 steps instead of 300: the strategies agree just as closely; the accuracy
is only what 10 steps reach.
"""
import argparse

import numpy as np

from jaxdp import devices, models, train
from jaxdp.core.run import data
from jaxdp.core.run.config import RunConfig

STRATEGIES = ("ddp", "ddp-ring", "zero2", "zero3")


def final_params(result, problem, steps: int) -> dict:
    """The run's parameters after its last step (read back from its trace), by flat name."""
    return {name: result.arrays[f"step/{steps}/param/{name}"] for name in models.flat_names(problem.params)}


def accuracy(problem, params: dict, dataset) -> float:
    """The fraction of all 1797 digits `params` classify correctly."""
    logits = problem.apply(models.unflatten_names(params), dataset._inputs.astype(np.float32))
    return float(np.mean(np.argmax(np.asarray(logits), -1) == dataset._labels))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="10 steps instead of 300 (smoke test)")
    args = parser.parse_args()
    devices.setup(4)  # 4 simulated CPU devices, before JAX starts

    steps = 10 if args.quick else 300
    base = RunConfig(model="mlp", data="digits", hidden=(64, 64), devices=4, steps=steps, batch_size=128,
                     optimizer="adam", lr=3e-3, dtype="float32", seed=0)
    print(f"mlp 64-64-10 on digits, adam, {steps} steps of 128 images, 4 devices")
    results = {}
    for strategy in STRATEGIES:
        r = train.run(base.replace(strategy=strategy), record=True, progress=False)
        results[strategy] = r
        print(f"  {strategy:<9} loss {r.losses[0]:.3f} -> {r.losses[-1]:.3f}  ({r.steps_per_s:.0f} steps/s)")

    dataset = data.load("digits", 0)
    problem = models.init(base, dataset)
    ref_losses, ref_params = np.array(results["ddp"].losses), final_params(results["ddp"], problem, steps)
    print("against ddp: the largest difference over all steps' losses and over the final parameters, and accuracy")
    for strategy, r in results.items():
        params = final_params(r, problem, steps)
        loss_diff = np.max(np.abs(np.array(r.losses) - ref_losses))
        param_diff = max(np.max(np.abs(params[n] - ref_params[n])) for n in params)
        print(f"  {strategy:<9} |loss - ddp's| {loss_diff:.1e}  |param - ddp's| {param_diff:.1e}  "
              f"accuracy {accuracy(problem, params, dataset):.1%}")


if __name__ == "__main__":  # spawned torch ranks re-import this file
    main()
