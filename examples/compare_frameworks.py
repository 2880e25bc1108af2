"""The compare report from Python: run strategies in jaxdp and torch_ref on one configuration and
write report.html / report.md / summary.json (the same as `jaxdp compare`).

    python examples/compare_frameworks.py [--quick] [--out reports/example]
"""
import argparse

from jaxdp import devices
from jaxdp.core.config import RunConfig
from jaxdp.harness.report import render, runner


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="two strategies, few steps (smoke test)")
    parser.add_argument("--out", default="reports/example")
    args = parser.parse_args()
    n = 2 if args.quick else 4
    devices.setup(n)

    strategies = ["zero2"] if args.quick else ["ddp", "ddp-ring", "zero1", "zero2", "zero3"]
    cfg = RunConfig(model="mlp", devices=n, steps=4 if args.quick else 20, batch_size=64, optimizer="adamw",
                    lr=1e-3, weight_decay=0.01, dtype="float32", hidden=(32, 32) if args.quick else (64, 64))
    summary = runner.compare(cfg, strategies, progress=print)
    paths = render.write(summary, args.out)
    for e in summary["strategies"]:
        j = e["frameworks"]["jax"]
        print(f"{e['name']:<9} parity {'pass' if e['parity']['pass'] else 'FAIL'}: worst gradient difference "
              f"{e['parity']['worst']['grad']:.1e}; JAX sends {j['comm']['total'] / 1024:.1f} KiB per device per step, "
              f"holds {sum(j['memory'].values()) / 1024:.1f} KiB of state")
    print("open", paths["html"])


if __name__ == "__main__":  # spawned torch ranks re-import this file
    main()
