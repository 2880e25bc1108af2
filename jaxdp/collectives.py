"""Collectives written out with `jax.lax.ppermute`, for use inside `shard_map` over one axis.

The ring collectives cut a flat vector into N chunks (padded with zeros to a multiple of N) and pass
chunks to the right-hand neighbour, device i -> i+1 (mod N), one chunk per round:
- `ring_reduce_scatter`: N-1 rounds; device i ends with chunk i summed over all devices.
  Each device sends (N-1)/N of the vector's bytes.
- `ring_all_gather`: N-1 rounds; every device ends with every device's chunk.
  Each device sends (N-1)/N of the gathered vector's bytes.
- `ring_all_reduce`: reduce-scatter then all-gather, 2(N-1) rounds, 2(N-1)/N of the bytes: the
  amount that does not grow with N, which is why the ring scales.

The parameter-server collectives move everything through device 0, with a binomial tree:
- `reduce_to_root`: ceil(log2 N) rounds; only device 0's result is the full sum.
- `broadcast_from_root`: ceil(log2 N) rounds; every device ends with device 0's value.

Compiled, a ring is its 2(N-1) (or N-1) collective-permutes of one chunk plus dynamic-slices,
dynamic-update-slices, adds and copies: the chunk a device sends or stores depends on the device, so
its index comes from `lax.axis_index` into `lax.dynamic_slice`, never a scatter
(tests/jaxdp/test_collectives.py reads the compiled op set).

Each function takes the axis name and reads N from it; with N = 1 they return their input.
A value arriving by ppermute is "varying" per device: use these under `shard_map(check_vma=False)`
or cast their results as needed.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax


def _ring(n: int) -> list[tuple[int, int]]:
    return [(i, (i + 1) % n) for i in range(n)]


def pack(arrays, size: int | None = None) -> jax.Array:
    """Flatten `arrays` into one vector (zero-padded to `size` elements) by dynamic-update-slices at
    static offsets into a zeroed buffer: each array is copied once. The same vector built with
    `jnp.concatenate` becomes one XLA:CPU loop fusion that has been measured at 50-500 ms for a
    million elements (it dominated ddp-ring's step), where these copies take about 1 ms."""
    total = sum(a.size for a in arrays)
    out = jnp.zeros(total if size is None else size, arrays[0].dtype)
    offset = 0
    for a in arrays:
        out = lax.dynamic_update_slice_in_dim(out, a.reshape(-1), offset, 0)
        offset += a.size
    return out


def unpack(flat: jax.Array, like) -> list:
    """The arrays `pack(like)` was built from, read back from `flat` (static slices)."""
    out, offset = [], 0
    for a in like:
        out.append(flat[offset:offset + a.size].reshape(a.shape))
        offset += a.size
    return out


def pad_to_multiple(x: jax.Array, n: int) -> jax.Array:
    """Flatten `x` and zero-pad it to a multiple of n elements."""
    flat = x.reshape(-1)
    return jnp.pad(flat, (0, -flat.size % n))


def _chunk(flat: jax.Array, k, size: int) -> jax.Array:
    """Chunk k (a traced index in [0, N)) of `flat`: one dynamic-slice, no gather."""
    return lax.dynamic_slice_in_dim(flat, k * size, size)


def _ring_gather_into(out: jax.Array, chunk: jax.Array, axis_name: str) -> jax.Array:
    """Write every device's `chunk` into `out` (flat, N chunks) in device order, by N-1 ring rounds:
    round s forwards the chunk received last (one's own in round 0) to i+1 and stores the one that
    arrives, which came from device (i-s-1) mod N. Each store is one dynamic-update-slice."""
    n, me = lax.axis_size(axis_name), lax.axis_index(axis_name)
    out = lax.dynamic_update_slice_in_dim(out, chunk, me * chunk.size, 0)
    for s in range(n - 1):
        chunk = lax.ppermute(chunk, axis_name, _ring(n))
        out = lax.dynamic_update_slice_in_dim(out, chunk, (me + n - s - 1) % n * chunk.size, 0)
    return out


def ring_reduce_scatter(x: jax.Array, axis_name: str) -> jax.Array:
    """Sum flat `x` over the axis; device i returns chunk i (size ceil(x.size / N)).

    Round s (0..N-2): device i sends its partial sum of chunk (i-s-1) mod N to device i+1, which
    adds its own copy of that chunk. After N-1 rounds device i holds chunk i, fully summed.
    Matches `lax.psum_scatter(pad_to_multiple(x, N), axis_name, tiled=True)`.
    """
    n = lax.axis_size(axis_name)
    flat = pad_to_multiple(x, n)
    if n == 1:
        return flat
    me, size = lax.axis_index(axis_name), flat.size // n
    acc = _chunk(flat, (me + n - 1) % n, size)  # indices kept non-negative: no sign fix-up
    for s in range(n - 1):
        acc = lax.ppermute(acc, axis_name, _ring(n)) + _chunk(flat, (me + 2 * n - s - 2) % n, size)
    return acc


def ring_all_gather(chunk: jax.Array, axis_name: str) -> jax.Array:
    """Concatenate every device's `chunk` in device order (flat, N * chunk.size elements).

    Round s (0..N-2): device i forwards the chunk it received last (its own in round 0) to i+1, and
    stores the one it receives, which came from device (i-s-1) mod N.
    Matches `lax.all_gather(chunk, axis_name, tiled=True)` for 1-D chunks.
    """
    n = lax.axis_size(axis_name)
    chunk = chunk.reshape(-1)
    if n == 1:
        return chunk
    return _ring_gather_into(jnp.zeros(n * chunk.size, chunk.dtype), chunk, axis_name)


def ring_all_reduce(x: jax.Array, axis_name: str) -> jax.Array:
    """Sum `x` (any shape) over the axis: ring reduce-scatter, then ring all-gather. Matches psum.

    The gather writes into the (padded) input's own buffer: in place when the caller is done with
    `x` (a packed gradient, a donated argument); otherwise XLA copies `x` first."""
    n = lax.axis_size(axis_name)
    if n == 1:
        return x
    flat = pad_to_multiple(x, n)
    summed = _ring_gather_into(flat, ring_reduce_scatter(flat, axis_name), axis_name)
    return summed[:x.size].reshape(x.shape)


def reduce_to_root(x: jax.Array, axis_name: str) -> jax.Array:
    """Sum `x` onto device 0 by a binomial tree: in the round with stride k, device i (i = k mod 2k)
    sends its partial sum to device i-k. Devices other than 0 end with partial sums."""
    n = lax.axis_size(axis_name)
    stride = 1
    while stride < n:
        pairs = [(src, src - stride) for src in range(stride, n, 2 * stride)]
        x = x + lax.ppermute(x, axis_name, pairs)  # a device that receives nothing gets zeros
        stride *= 2
    return x


def broadcast_from_root(x: jax.Array, axis_name: str) -> jax.Array:
    """Every device gets device 0's `x`: the reduce tree run backwards (stride k: i -> i+k)."""
    n = lax.axis_size(axis_name)
    me = lax.axis_index(axis_name)
    stride = 1
    while stride * 2 < n:
        stride *= 2
    while stride >= 1 and n > 1:
        pairs = [(src, src + stride) for src in range(0, n - stride, 2 * stride)]
        received = lax.ppermute(x, axis_name, pairs)
        x = jnp.where(me % (2 * stride) == stride, received, x)
        stride //= 2
    return x
