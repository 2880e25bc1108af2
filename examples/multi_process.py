"""Two processes, four devices: `jaxdp train --processes 2` runs real jax.distributed processes
(coordinator on a loopback port, gloo collectives), each holding two of the four devices and feeding
only its own rows of every batch. Its trace equals the one-process run's (one process, four devices)
to float64 rounding: the global batches (x, y) and initial weights bit for bit; losses, gradients and
parameters within about 1e-15 of the largest value (the same sums, added in another order).

    python examples/multi_process.py [--quick]

`--quick` trains 3 steps instead of 20. Exit status 1 when the two traces differ beyond 1e-12.
"""
import argparse
import os
import subprocess
import sys
import tempfile

from jaxdp.core import trace

BOUND = 1e-12  # float64: what a different order of the same sums can change


def train(args: list[str], label: str) -> None:
    """`jaxdp train ARGS` in a fresh process (with its own devices); prints its summary line."""
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # the run sets its own device count
    run = subprocess.run([sys.executable, "-m", "jaxdp", "train", *args], capture_output=True, text=True, env=env,
                         timeout=300)
    if run.returncode:
        sys.exit(f"{label}: jaxdp train failed (exit {run.returncode}): {run.stderr.strip()[-2000:]}")
    summary = [line for line in run.stdout.splitlines() if " steps, loss " in line]
    print(f"{label}: {(summary[-1] if summary else run.stdout.strip()).split('; trace:')[0]}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 steps instead of 20 (smoke test)")
    args = parser.parse_args()

    steps = "3" if args.quick else "20"
    common = ["--strategy", "zero2", "--devices", "4", "--steps", steps, "--batch-size", "32", "--dtype", "float64",
              "--optimizer", "adam", "--lr", "1e-2"]
    with tempfile.TemporaryDirectory() as tmp:
        one, two = os.path.join(tmp, "one.npz"), os.path.join(tmp, "two.npz")
        train([*common, "--trace", one], "1 process x 4 devices ")
        train([*common, "--processes", "2", "--trace", two], "2 processes x 2 devices")
        result = trace.diff(trace.load(two), trace.load(one))
    print("2 processes x 2 devices against 1 process x 4 devices, per field of the trace:")
    print(trace.format_diff(result, tolerance=BOUND))
    same = all(err <= BOUND for err in result["worst"].values())
    print(f"verdict: {'the same run, to float64 rounding' if same else 'the runs DIFFER'} (bound {BOUND:g} relative)")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
