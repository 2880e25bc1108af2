"""torch_ref accounting: the bytes the process group actually ran (torch.profiler's gloo events,
inside DDP, ZeroRedundancyOptimizer and FSDP2 included) equal the formulas of `theory` exactly, and
the bytes each rank holds equal `memory_theory`, for every strategy at N = 2, 3, 4 (even, odd, and
sizes that N does not divide; N = 8 was dropped from the default suite: 8 gloo ranks on 2 cores took
36 s and the formulas are the same functions of N).

One spawned world per N measures every configuration (`accounting.measure_rank`)."""
from __future__ import annotations

import functools

import pytest

from jaxdp.core.run import data
from tests.torch_helpers import BASE, init_for, init_key
from torch_ref import models
from torch_ref.analysis import accounting
from torch_ref.launch import launch

NS = [2, 3, 4]
CFG = BASE.replace(batch_size=24, optimizer="adam", steps=3)
STRATEGIES = ["ddp", "ddp-naive", "ddp-bucket", "ddp-ring", "zero1", "zero2", "zero3", "dp"]
CONFIGS = ([CFG.replace(strategy=s) for s in STRATEGIES]
           + [CFG.replace(strategy=s, clip_norm=0.5, optimizer="momentum") for s in ("zero1", "zero2", "zero3")])


# `--model cnn` (issue 15): BatchNorm's collectives (sync: the hand-written all-reduces; local: rank 0's
# running statistics broadcast; DDP's own buffer broadcast), a few cases in the same worlds. The BatchNorm
# term is the same for every strategy but DDP-wrapped ones (ddp, zero1: both modes below), so every N, both
# modes and accum 1 and 3 appear, not every strategy (each case adds seconds to a world of gloo ranks).
CNN = CFG.replace(model="cnn", data="digits", channels=(2, 3), batch_size=36)
CNN_CASES = {2: [CNN.replace(strategy="ddp", batchnorm="sync", accum=3),
                 CNN.replace(strategy="zero3", batchnorm="local", accum=3),
                 CNN.replace(strategy="ddp-bucket", batchnorm="local")],
             3: [CNN.replace(strategy="zero1", batchnorm="local"), CNN.replace(strategy="dp", batchnorm="sync")],
             4: [CNN.replace(strategy="zero2", batchnorm="sync", accum=3)]}
# Two parameter tensors (a one-layer mlp) on the world of 4: fewer tensors than ranks, for zero1's whole-parameter
# partition (a world of 8 for the 6 tensors of CFG cost 64 CPU-s of the suite for this one claim).
TINY = {4: [CFG.replace(hidden=(), strategy=s) for s in ("zero1", "zero2")]}


def _measure_all(rank, n, jobs):
    return [accounting.measure_rank(rank, n, cfg, init, steps=2, warmup=1) for cfg, init in jobs]


def _key(cfg):
    if cfg.hidden == ():
        return ("tiny", cfg.strategy)
    if cfg.model == "cnn":
        return ("cnn", cfg.strategy, cfg.batchnorm, cfg.accum)
    return (cfg.strategy, cfg.optimizer, cfg.clip_norm)


@functools.cache
def measured(n: int) -> dict:
    cfgs = [c.replace(devices=n) for c in CONFIGS + CNN_CASES.get(n, []) + TINY.get(n, [])]
    jobs = [(c, init_for(init_key(c))) for c in cfgs]
    views = launch(_measure_all, n, jobs, timeout_s=600, pg_timeout_s=120)
    return {_key(c): accounting.summarise(c, [v[i] for v in views]) for i, c in enumerate(cfgs)}


def measured_view(n: int, key) -> dict:
    """`measured(n)[key]`, measured once more where the ranks' counts differ: seen in about 1 of 30 runs (zero1, N = 3,
    the mlp and the cnn; not reproduced outside the suite's worlds), one rank's profiler missed or doubled an event
    of gloo's asynchronous work. The assertions hold on the second measurement; a real difference between ranks
    would repeat, and `ranks_differ` names its fields."""
    got = measured(n)[key]
    if "comm_per_rank" in got:
        measured.cache_clear()
        got = measured(n)[key]
    return got


def ranks_differ(got) -> dict:
    """{rank: {field: bytes}} of the fields where a rank's communication differs from rank 0's."""
    ranks = got.get("comm_per_rank", [])
    return {r: {k: v for k, v in c.items() if v != ranks[0][k]} for r, c in enumerate(ranks) if c != ranks[0]}


@functools.cache
def shapes(cfg=CFG) -> list[tuple[int, ...]]:
    dataset = data.load(cfg.data, cfg.seed, cfg.seq_len)
    return [tuple(p.shape) for p in models.build(cfg, dataset).parameters()]  # torch layout: Linear [out, in]


@functools.cache
def batchnorm(cfg) -> accounting.BatchNormCount:
    model = models.build(cfg, data.load(cfg.data, cfg.seed, cfg.seq_len))
    return accounting.batchnorm_count(model, sync=cfg.batchnorm == "sync")


ITEMSIZE = 8  # float64
KEYS = [(c.strategy, c.optimizer, c.clip_norm) for c in CONFIGS]


@pytest.mark.parametrize("n", NS)
@pytest.mark.parametrize("key", KEYS, ids=lambda k: "-".join(map(str, k)))
def test_measured_communication_equals_theory(key, n):
    strategy, _, clip = key
    got = measured_view(n, key)
    expected = accounting.theory(strategy, shapes(), n, ITEMSIZE, clip=clip > 0)
    for kind in (*accounting.KINDS, "total"):
        assert got["comm"][kind] == pytest.approx(expected[kind], rel=1e-12, abs=1e-9), (kind, got["comm"], expected)
    assert "comm_per_rank" not in got, ranks_differ(got)  # per device by convention: every rank the same
    assert len(got["step_times"]) == 2 and all(t > 0 for t in got["step_times"])


@pytest.mark.parametrize("n", NS)
@pytest.mark.parametrize("key", KEYS, ids=lambda k: "-".join(map(str, k)))
def test_memory_per_rank_equals_expected(key, n):
    strategy, optimizer, _ = key
    got = measured(n)[key]["memory_per_rank"]
    expected = [accounting.memory_theory(strategy, shapes(), n, ITEMSIZE, optimizer, rank=r) for r in range(n)]
    assert got == expected


def test_zero1_partitions_whole_parameters_unlike_zero2_flat_shards():
    """2 parameter tensors (10x32 and 10) on 4 ranks: ZeroRedundancyOptimizer gives two ranks nothing and the
    weight's owner most of the state; zero2's flat shards are even to the element."""
    zero1 = [m["opt_state"] for m in measured(4)[("tiny", "zero1")]["memory_per_rank"]]
    zero2 = [m["opt_state"] for m in measured(4)[("tiny", "zero2")]["memory_per_rank"]]
    assert zero1.count(0) == 2 and max(zero1) > 3 * sum(zero1) / 4
    assert len(set(zero2)) == 1 and zero2[0] > 0
    assert any("whole parameters" in note for note in measured(4)[("tiny", "zero1")]["notes"])


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


CNN_KEYS = [(n, c) for n, cases in CNN_CASES.items() for c in cases]


def _assert_comm(got, expected):
    for kind in (*accounting.KINDS, "total"):
        assert got["comm"][kind] == pytest.approx(expected[kind], rel=1e-12, abs=1e-9), (kind, got["comm"], expected)


@pytest.mark.parametrize("n, cfg", CNN_KEYS, ids=[f"{c.strategy}-n{n}-{c.batchnorm}-a{c.accum}" for n, c in CNN_KEYS])
def test_cnn_batchnorm_communication_equals_theory(n, cfg):
    """What the process group ran for a cnn step equals `theory` with its BatchNorm term; without that
    term (the negative control) it does not."""
    got = measured_view(n, _key(cfg))
    bn = batchnorm(cfg)
    assert bn == accounting.BatchNormCount(sum(cfg.channels), 2, cfg.batchnorm == "sync")
    _assert_comm(got, accounting.theory(cfg.strategy, shapes(cfg), n, ITEMSIZE, accum=cfg.accum, batchnorm=bn))
    without = accounting.theory(cfg.strategy, shapes(cfg), n, ITEMSIZE, accum=cfg.accum)
    assert got["comm"]["total"] != pytest.approx(without["total"])
    assert "comm_per_rank" not in got, (ranks_differ(got), got["comm"], got["comm_ops"])


def test_backend_events_are_paired_with_their_process_group():
    """`comm_groups.backend_groups`: each gloo event takes the earliest unpaired c10d range of its size that
    started before it (two all-reduces of 85 elements: the group's reduce-scatter, then the shard across);
    an event no range names takes its thread's group (DTensor's clip reduction), or else the world."""
    from types import SimpleNamespace

    from torch_ref import comm_groups

    def event(name, start, shape=(), thread=1):
        return SimpleNamespace(name=name, time_range=SimpleNamespace(start=start), input_shapes=[list(shape)],
                               thread=thread)

    events = [event("c10d group 0,1 85", 0), event("gloo:all_reduce", 1, [85], 3), event("c10d group 1,3 85", 2),
              event("gloo:all_reduce", 3, [85], 5), event("gloo:all_reduce", 4, [], 2),
              event("gloo:all_reduce", 5, [6], 3)]
    got = comm_groups.backend_groups(events, 4)
    assert [got[id(e)] for e in events if e.name.startswith("gloo")] == [[0, 1], [1, 3], [0, 1, 2, 3], [0, 1]]


@pytest.mark.parametrize("k", [1, 4])
def test_diloco_theory_is_the_parameters_all_reduce_once_per_k_steps(k):
    """diloco's row (`comm` "outer"): the loss's scalar every step plus ddp's all-reduce of the parameters / K;
    the same formula as jaxdp's theory (jaxdp/analysis/theory.py), which tests/jaxdp/strategies/test_diloco.py
    holds against the compiled step."""
    from jaxdp.analysis import theory as jax_theory

    shapes, n = [(16, 32), (16,)], 4
    loss = 2 * (n - 1) / n * ITEMSIZE
    got = accounting.theory("diloco", shapes, n, ITEMSIZE, inner_steps=k)
    ddp = accounting.theory("ddp", shapes, n, ITEMSIZE)
    assert got["total"] == pytest.approx(loss + (ddp["total"] - loss) / k, rel=1e-12)
    assert got["total"] == pytest.approx(jax_theory.theory("diloco", [512, 16], n, ITEMSIZE, inner_steps=k)["total"])
