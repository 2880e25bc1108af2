"""Reading the compiled program (`jaxdp.analysis.hlo`, `accounting.communication`): a collective inside a loop
runs once per iteration, nested loops multiply, program order is kept."""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxdp import devices, train
from jaxdp.analysis import accounting, hlo
from tests.conftest import BASE


def _compiled(f, n: int = 2, size: int = 8) -> str:
    mesh = devices.mesh(jax.devices()[:n])
    g = jax.shard_map(f, mesh=mesh, in_specs=P("data"), out_specs=P("data"), check_vma=False)
    x = jax.device_put(jnp.ones(n * size), NamedSharding(mesh, P("data")))
    return jax.jit(g).lower(x).compile().as_text()


def _nested(x):
    x = lax.psum(x, "data")  # once
    def inner(_, v):
        return lax.psum(jnp.sin(v), "data")  # 3 x 4 times
    def outer(_, v):
        v = lax.fori_loop(0, 4, inner, v)
        return lax.all_gather(v[:2], "data", tiled=True).sum() + v  # 3 times
    return lax.fori_loop(0, 3, outer, x)


def test_trips_multiply_through_nested_loops():
    found = hlo.collectives_in_order(_compiled(_nested), 2)
    assert [(c["op"], c["trips"]) for c in found] == [("all-reduce", 1), ("all-reduce", 12), ("all-gather", 3)]


def test_communication_counts_every_iteration():
    comm = accounting.communication(_compiled(_nested), 2)
    assert comm["all-reduce"]["ops"] == 13 and comm["all-gather"]["ops"] == 3
    one_all_reduce = 2 * (2 - 1) / 2 * 8 * 8  # 8 float64 values, N = 2
    assert comm["all-reduce"]["sent"] == 13 * one_all_reduce


def test_zero3_gathers_are_counted_once_per_micro_batch():
    """zero3 gathers its parameters for every micro-batch; the first micro-batch runs before the
    loop, the others in it: with accum 3 the step runs 3 times the gathers of accum 1."""
    gathers = {}
    for accum in (1, 3):
        cfg = BASE.replace(strategy="zero3", devices=3, accum=accum)
        _, dataset, problem, _, s = train.prepare(cfg)
        state, batch = s.init(problem.params), s.put_batch(*train.host_batch(cfg, dataset, 1))
        gathers[accum] = accounting.step_communication(s, state, batch, 3)["all-gather"]["ops"]
    assert gathers[1] > 0 and gathers[3] == 3 * gathers[1], gathers


def test_replica_groups_explicit_iota_and_permute_pairs():
    """A collective's groups, in each form XLA writes them: explicit, iota (transposed: hsdp's columns),
    none (every device); a collective-permute's groups are the devices its pairs connect."""
    line = "%x = f32[8]{0} all-gather(f32[2]{0} %p), replica_groups={{0,1,2,3},{4,5,6,7}}, dimensions={0}"
    assert hlo.collective(line, 8)["groups"] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    line = "%x = f32[4]{0} all-reduce(f32[4]{0} %p), replica_groups=[4,2]<=[2,4]T(1,0), to_apply=%sum"
    c = hlo.collective(line, 8)
    assert c["groups"] == [[0, 4], [1, 5], [2, 6], [3, 7]] and c["group"] == 2
    assert accounting.crosses_groups(c, 4) and not accounting.crosses_groups(c, 8)
    line = "%x = f32[4]{0} all-reduce(f32[4]{0} %p), replica_groups=[2,4]<=[8], to_apply=%sum"
    assert hlo.collective(line, 8)["groups"] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert hlo.collective("%x = f32[] all-reduce(f32[] %p), replica_groups={}, to_apply=%sum", 4)["group"] == 4
    line = "%x = f32[8]{0} collective-permute(f32[8]{0} %p), source_target_pairs={{0,1},{1,0},{2,3},{3,2}}"
    assert hlo.collective(line, 4)["groups"] == [[0, 1], [2, 3]]


def test_a_tuple_collective_reports_every_dtype_it_carries():
    """A hand-written tuple all-reduce of f32 and bf16 arrays: each type once, in tuple order; bytes by type."""
    line = ("%all-reduce.3 = (f32[4]{0}, bf16[8,2]{1,0}, f32[2]{0}) all-reduce(%a, %b, %c), channel_id=2, "
            "replica_groups={{0,1}}, use_global_device_ids=true, to_apply=%region_0.1")
    c = hlo.collective(line, 2)
    assert (c["dtype"], c["array_dtypes"], c["arrays"]) == ("f32+bf16", ["f32", "bf16", "f32"], 3)
    assert c["bytes"] == 4 * 4 + 2 * 16 + 4 * 2 and c["elements"] == 22


def test_a_real_tuple_all_reduce_shows_its_bf16_part_that_xla_cpu_widened():
    """psum of an f32 and a bf16 array: XLA:CPU combines them into one tuple all-reduce and runs the bf16 one
    widened to f32 (convert, reduce, convert back: every type in the program reads f32). The bf16 part is read
    back (`analysis/widened.py`): dtype "f32+bf16>f32", one array widened; the f32 part stays f32."""
    mesh = devices.mesh(jax.devices()[:2])
    g = jax.shard_map(lambda x: lax.psum((x, x.astype(jnp.bfloat16)), "data"), mesh=mesh, in_specs=P("data"),
                      out_specs=P(), check_vma=False)
    x = jax.device_put(jnp.ones(16, jnp.float32), NamedSharding(mesh, P("data")))
    text = jax.jit(g).lower(x).compile().as_text()
    tuples = [c for c in hlo.collectives_in_order(text, 2) if c["arrays"] > 1]
    assert len(tuples) == 1 and tuples[0]["array_dtypes"] == ["f32", "f32"], tuples  # what XLA:CPU's types say
    assert (tuples[0]["dtype"], tuples[0]["widened"]) == ("f32+bf16>f32", 1)
