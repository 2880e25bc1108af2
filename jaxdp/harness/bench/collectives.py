"""The hand-written ring collectives (`jaxdp.collectives`) timed alone against XLA's built-ins.

For each size (MB of float32 per device: the vector an all-reduce or reduce-scatter reduces, the
vector an all-gather produces) and each N, one jitted `shard_map` per collective: the ring and the
built-in see the same input (an all-reduce's donated, as DDP gives up a gradient buffer to its
all-reduce), are compiled once, warmed up, then timed `repeats` times in turn (median).
On simulated CPU devices both run in one process on the same cores: the ratio says how the ring's
compiled program (collective-permutes, slices, dynamic-update-slices) compares with XLA:CPU's own
collective on this machine, not how either would do on a network.
"""
from __future__ import annotations

import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from ... import collectives, devices
from ...devices import AXIS

MB = 2 ** 20
# name: (ring, XLA's built-in, elements of the per-device input given the size in elements)
OPS = {
    "all_reduce": (lambda v: collectives.ring_all_reduce(v, AXIS), lambda v: lax.psum(v, AXIS), lambda e, n: e),
    "reduce_scatter": (lambda v: collectives.ring_reduce_scatter(v, AXIS),
                       lambda v: lax.psum_scatter(v, AXIS, tiled=True), lambda e, n: e),
    "all_gather": (lambda v: collectives.ring_all_gather(v, AXIS),
                   lambda v: lax.all_gather(v, AXIS, tiled=True), lambda e, n: e // n),
}


def _compiled(fn, mesh, x, donate: bool):
    f = jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=P(AXIS), out_specs=P(AXIS), check_vma=False),
                donate_argnums=0 if donate else ())
    return f.lower(x).compile()


def _timed_pair(ring, xla, mesh, x, repeats: int, donate: bool) -> list[tuple[float, float]]:
    """[(median wall seconds, median CPU seconds of this process)] of one call of each, compiled
    and warmed up first; the two are called in turn, so that load from elsewhere on the machine
    falls on both alike. CPU time (all threads) is the work done, whatever else runs. Each call
    gets a fresh copy of x (made untimed); with `donate`, both give it up, as DDP gives a gradient
    buffer up to its all-reduce, and may write their result in place."""
    fs = [_compiled(ring, mesh, x, donate), _compiled(xla, mesh, x, donate)]
    fresh = jax.jit(lambda a: a + 0, out_shardings=x.sharding)
    times = [([], []), ([], [])]
    for i in range(repeats + 2):  # the first two calls of each: warm-up
        for f, (wall, cpu) in zip(fs, times, strict=True):
            arg = fresh(x).block_until_ready()
            t0, c0 = time.perf_counter(), time.process_time()
            f(arg).block_until_ready()
            if i >= 2:
                wall.append(time.perf_counter() - t0)
                cpu.append(time.process_time() - c0)
    return [(statistics.median(wall), statistics.median(cpu)) for wall, cpu in times]


def collectives_benchmark(sizes_mb=(1, 4, 16, 64), ns=(2, 4), repeats: int = 10, ops=tuple(OPS)) -> list[dict]:
    """Rows {op, mb, devices, ring_ms, xla_ms, ratio (ring / XLA, wall), ring_cpu_ms, xla_cpu_ms,
    cpu_ratio} for every op, size and N. Needs at least max(ns) devices (`devices.setup` before JAX
    initialises)."""
    if len(jax.devices()) < max(ns):
        raise ValueError(f"collectives_benchmark needs {max(ns)} devices, JAX has {len(jax.devices())}: "
                         "call jaxdp.devices.setup(N) before JAX initialises")
    rows = []
    for n in ns:
        mesh = devices.mesh(jax.devices()[:n])
        for mb in sizes_mb:
            elements = int(mb * MB) // 4 // n * n
            for op in ops:
                ring, xla, local = OPS[op]
                x = np.random.default_rng(0).standard_normal(n * local(elements, n)).astype(np.float32)
                x = jax.device_put(jnp.asarray(x), NamedSharding(mesh, P(AXIS)))
                # an all-reduce's result has its input's shape: both may reuse the donated buffer
                (ring_s, ring_cpu), (xla_s, xla_cpu) = _timed_pair(ring, xla, mesh, x, repeats, op == "all_reduce")
                rows.append({"op": op, "mb": mb, "devices": n, "ring_ms": 1e3 * ring_s, "xla_ms": 1e3 * xla_s,
                             "ratio": ring_s / xla_s, "ring_cpu_ms": 1e3 * ring_cpu, "xla_cpu_ms": 1e3 * xla_cpu,
                             "cpu_ratio": ring_cpu / xla_cpu})
    return rows


def format_rows(rows: list[dict]) -> str:
    lines = [f"{'op':<15} {'MB':>5} {'N':>3} {'ring ms':>9} {'XLA ms':>9} {'ring/XLA':>9} {'ring cpu':>9} "
             f"{'XLA cpu':>9} {'cpu ratio':>9}"]
    lines += [f"{r['op']:<15} {r['mb']:>5g} {r['devices']:>3} {r['ring_ms']:>9.2f} {r['xla_ms']:>9.2f} "
              f"{r['ratio']:>9.2f} {r['ring_cpu_ms']:>9.2f} {r['xla_cpu_ms']:>9.2f} {r['cpu_ratio']:>9.2f}"
              for r in rows]
    return "\n".join(lines)


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-mb", type=float, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--ns", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--ops", nargs="+", default=list(OPS), choices=list(OPS))
    args = parser.parse_args()
    devices.setup(max(args.ns), "cpu")
    print(format_rows(collectives_benchmark(args.sizes_mb, args.ns, args.repeats, args.ops)))
