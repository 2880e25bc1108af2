"""torch_ref accounting: the bytes the process group actually ran (torch.profiler's gloo events,
inside DDP, ZeroRedundancyOptimizer and FSDP2 included) equal the formulas of `theory` exactly, and
the bytes each rank holds equal `memory_theory`, for every strategy at N = 2, 3, 4 (even, odd, and
sizes that N does not divide; N = 8 was dropped from the default suite: 8 gloo ranks on 2 cores took
36 s and the formulas are the same functions of N).

One spawned world per N measures every configuration (`accounting.measure_rank`)."""
from __future__ import annotations

import functools

import pytest

from jaxdp import data
from torch_ref import accounting, models
from torch_ref.launch import launch

from .torch_helpers import BASE, init_for, init_key

NS = [2, 3, 4]
CFG = BASE.replace(batch_size=24, optimizer="adam", steps=3)
STRATEGIES = ["ddp", "ddp-naive", "ddp-bucket", "ddp-ring", "zero1", "zero2", "zero3", "dp"]
CONFIGS = ([CFG.replace(strategy=s) for s in STRATEGIES]
           + [CFG.replace(strategy=s, clip_norm=0.5, optimizer="momentum") for s in ("zero1", "zero2", "zero3")])


def _measure_all(rank, n, cfgs, init):
    return [accounting.measure_rank(rank, n, cfg, init, steps=2, warmup=1) for cfg in cfgs]


@functools.cache
def measured(n: int) -> dict:
    cfgs = [c.replace(devices=n) for c in CONFIGS]
    views = launch(_measure_all, n, cfgs, init_for(init_key(CFG)), timeout_s=600, pg_timeout_s=120)
    return {(c.strategy, c.optimizer, c.clip_norm): accounting.summarise(c, [v[i] for v in views])
            for i, c in enumerate(cfgs)}


@functools.cache
def shapes() -> list[tuple[int, ...]]:
    dataset = data.load(CFG.data, CFG.seed, CFG.seq_len)
    return [tuple(p.shape) for p in models.build(CFG, dataset).parameters()]  # torch layout: Linear [out, in]


ITEMSIZE = 8  # float64
KEYS = [(c.strategy, c.optimizer, c.clip_norm) for c in CONFIGS]


@pytest.mark.parametrize("n", NS)
@pytest.mark.parametrize("key", KEYS, ids=lambda k: "-".join(map(str, k)))
def test_measured_communication_equals_theory(key, n):
    strategy, _, clip = key
    got = measured(n)[key]
    if "comm_per_rank" in got:
        # Seen once in four full runs (zero1, N=3): one rank's profiler missed or doubled an event of
        # gloo's asynchronous work. Measure the world once more; the assertions below are unchanged.
        measured.cache_clear()
        got = measured(n)[key]
    expected = accounting.theory(strategy, shapes(), n, ITEMSIZE, clip=clip > 0)
    for kind in (*accounting.KINDS, "total"):
        assert got["comm"][kind] == pytest.approx(expected[kind], rel=1e-12, abs=1e-9), (kind, got["comm"], expected)
    assert "comm_per_rank" not in got  # per device by convention: every rank the same
    assert len(got["step_times"]) == 2 and all(t > 0 for t in got["step_times"])


@pytest.mark.parametrize("n", NS)
@pytest.mark.parametrize("key", KEYS, ids=lambda k: "-".join(map(str, k)))
def test_memory_per_rank_equals_expected(key, n):
    strategy, optimizer, _ = key
    got = measured(n)[key]["memory_per_rank"]
    expected = [accounting.memory_theory(strategy, shapes(), n, ITEMSIZE, optimizer, rank=r) for r in range(n)]
    assert got == expected


def test_zero1_partitions_whole_parameters_unlike_zero2_flat_shards():
    """6 parameter tensors on 8 ranks: ZeroRedundancyOptimizer gives two ranks nothing and the
    largest weight's owner most of the state; zero2's flat shards are even to the element."""
    zero1 = [m["opt_state"] for m in measured(8)[("zero1", "adam", 0.0)]["memory_per_rank"]]
    zero2 = [m["opt_state"] for m in measured(8)[("zero2", "adam", 0.0)]["memory_per_rank"]]
    assert zero1.count(0) == 2 and max(zero1) > 3 * sum(zero1) / 8
    assert len(set(zero2)) == 1
    assert any("whole parameters" in note for note in measured(8)[("zero1", "adam", 0.0)]["notes"])


@pytest.mark.parametrize("strategy", ["zero2", "zero3"])
def test_gloo_reduce_scatter_is_counted_as_the_all_reduce_it_runs(strategy):
    n = 4
    got = measured(n)[(strategy, "adam", 0.0)]
    assert got["comm_ops"]["reduce-scatter"] == 0 and got["comm_requested"]["c10d::_reduce_scatter_base_"] > 0
    assert any("ran as all-reduce" in note for note in got["notes"])
    ideal = accounting.theory(strategy, shapes(), n, ITEMSIZE, backend="nccl")
    loss = 2 * (n - 1) / n * ITEMSIZE
    assert got["comm"]["all-reduce"] - loss == pytest.approx(2 * ideal["reduce-scatter"], rel=1e-12)


def test_zero3_gathers_each_layer_twice():
    got = measured(2)[("zero3", "adam", 0.0)]
    assert got["comm_ops"]["all-gather"] == 2 * len(CFG.hidden + (1,))  # 3 Linear layers, forward and backward


def test_peak_covers_what_each_rank_holds_and_falls_with_sharding():
    """The in-step peak (the rank's tensors at the step's start + the highest rise of the profiler's
    memory events) is at least the state the rank holds when its optimizer steps (gradients included,
    which exist only inside the step: a peak without the rise would miss them), and sharding lowers it."""
    got = measured(2)
    for key, r in got.items():
        m = r["memory"]
        assert r["peak_bytes"] >= sum(m.values()), (key, r["peak_bytes"], m)
        assert r["peak_bytes_per_rank"][0] == r["peak_bytes"]
    assert got[("zero3", "adam", 0.0)]["peak_bytes"] < got[("ddp", "adam", 0.0)]["peak_bytes"]
