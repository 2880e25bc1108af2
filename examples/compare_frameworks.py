"""The compare report from Python: run several strategies in both jaxdp and torch_ref on one
configuration, write report.html / report.md / summary.json (as `jaxdp compare` does), and print
what the comparison shows: per strategy, whether the two frameworks agree (the parity verdict), and
what each strategy sends and holds per device; then how the strategies differ from the first one.

    python examples/compare_frameworks.py [--quick] [--out reports/example]

`--quick` compares ddp and zero3 on 2 devices for 4 steps; the full run five strategies on 4 devices
for 20. Exit status 1 when a strategy fails parity.
"""
import argparse
import sys

from jaxdp import devices
from jaxdp.core.run.config import RunConfig
from jaxdp.harness.report import render, runner


def kib(n: float) -> str:
    return f"{n / 1024:.1f} KiB"


def describe(entry: dict) -> list[str]:
    """One strategy's lines: the parity verdict, then what each framework sends and holds per device."""
    parity, theory = entry["parity"], entry["theory"]["comm"]
    lines = [f"{entry['name']:<9} parity {'pass' if parity['pass'] else 'FAIL'} "
             f"(worst gradient difference {parity['worst']['grad']:.1e})"]
    for framework, side in entry["frameworks"].items():
        lines.append(f"  {framework:<5} sends {kib(side['comm']['total'])} per step (theory {kib(theory['total'])}), "
                     f"holds {kib(sum(side['memory'].values()))}")
    if theory.get("reduce-scatter") and not entry["frameworks"]["torch"]["comm"].get("reduce-scatter"):
        lines.append("  (gloo has no reduce-scatter: torch runs an all-reduce there, twice the bytes)")
    return lines


def contrast(first: dict, other: dict) -> str:
    """How `other` differs from `first` on the JAX side: state held and bytes sent per device."""
    a, b = first["frameworks"]["jax"], other["frameworks"]["jax"]
    held = sum(b["memory"].values()) / sum(a["memory"].values())
    sent = b["comm"]["total"] / a["comm"]["total"]
    return f"{other['name']} holds {held:.2f}x {first['name']}'s state per device and sends {sent:.2f}x its bytes"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="ddp and zero3, 2 devices, 4 steps (smoke test)")
    parser.add_argument("--out", default="reports/example", help="the report's folder (made when missing)")
    args = parser.parse_args()
    n = 2 if args.quick else 4
    devices.setup(n)

    strategies = ["ddp", "zero3"] if args.quick else ["ddp", "ddp-ring", "zero1", "zero2", "zero3"]
    cfg = RunConfig(model="mlp", devices=n, steps=4 if args.quick else 20, batch_size=64, optimizer="adamw",
                    lr=1e-3, weight_decay=0.01, dtype="float32", hidden=(32, 32) if args.quick else (64, 64))
    summary = runner.compare(cfg, strategies, progress=print)
    paths = render.write(summary, args.out)
    entries = summary["strategies"]
    print(f"{len(entries)} strategies, jaxdp against torch_ref, {n} devices, {cfg.steps} steps (bytes per device):")
    for entry in entries:
        print("\n".join("  " + line for line in describe(entry)))
    for entry in entries[1:]:
        print(" ", contrast(entries[0], entry))
    passed = all(e["parity"]["pass"] for e in entries)
    print(f"verdict: {'the frameworks agree on every strategy' if passed else 'parity FAILS'} "
          f"(tolerance {summary['tolerance']})")
    print("open", paths["html"])
    return 0 if passed else 1


if __name__ == "__main__":  # spawned torch ranks re-import this file
    sys.exit(main())
