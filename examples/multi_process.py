"""Two processes, four devices: `jaxdp train --processes 2` runs real jax.distributed processes
(coordinator on a loopback port, gloo collectives), each feeding only its own rows of every batch.
The trace equals the one-process run's.

    python examples/multi_process.py [--quick]
"""
import argparse
import os
import subprocess
import sys
import tempfile

from jaxdp.core import trace


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()

    steps = "3" if args.quick else "20"
    common = ["--strategy", "zero2", "--devices", "4", "--steps", steps, "--batch-size", "32", "--dtype", "float64",
              "--optimizer", "adam", "--lr", "1e-2"]
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    with tempfile.TemporaryDirectory() as tmp:
        one, two = os.path.join(tmp, "one.npz"), os.path.join(tmp, "two.npz")
        subprocess.run(
            [sys.executable, "-m", "jaxdp", "train", *common, "--trace", one], check=True, env=env, timeout=300
        )
        subprocess.run(
            [sys.executable, "-m", "jaxdp", "train", *common, "--processes", "2", "--trace", two],
            check=True,
            env=env,
            timeout=300,
            stderr=subprocess.DEVNULL,
        )
        worst = trace.diff(trace.load(two), trace.load(one))["worst"]
    print("2 processes x 2 devices vs 1 process x 4 devices, worst relative difference per field:")
    for field, err in worst.items():
        print(f"  {field:<6} {err:.1e}")


if __name__ == "__main__":  # spawned torch ranks re-import this file
    main()
