"""Mutation tests (issue 13): deliberate bugs injected into real runs (`tests.mutations`), each of
which the checks must catch; the program-level checks of the fp32 reduction (compiled HLO, the
tensors torch's process group receives); and replica consistency.

A representative subset of the catalogue runs here; `python -m tests.mutations --out
docs/MUTATIONS.md` runs all of it (every bug, both frameworks, every dtype) and writes the table.
"""
from __future__ import annotations

import functools

import jax
import pytest

from jaxdp.analysis import accounting
from jaxdp.core.registry import strategies as registry
from jaxdp.core.run.config import JIT_STRATEGIES
from jaxdp.harness import pair_runs
from jaxdp.strategies.jit import step as jit_step
from tests import mutations
from tests.mutations import checks, score

# (bug, framework, dtype): every check kind and every dtype at least once, all on two devices (one
# torch world): the issue's own missing 1/N in bf16 (it moved the loss by 0.06% and parity said ok), and
# one bug of cnn's synchronised BatchNorm (under accumulation: the batch layout matters there).
SUBSET = [
    ("missing-1/N", "jax", "bfloat16"),
    ("summed-twice", "jax", "float64"),
    ("decay-one-shard", "jax", "float32"),
    ("bf16-reduction", "jax", "bfloat16"),
    ("stale-grads", "torch", "float32"),
    ("bf16-reduction", "torch", "bfloat16"),
    ("bn-no-backward-reduce", "torch", "float64"),  # cnn: sync BatchNorm's backward all-reduce removed
    ("lr-1.00001x", "jax", "float32"),  # issue 23's small bugs, next to the error model's relaxed elements
    ("one-element", "torch", "float32"),
]
BF16 = mutations.ADAM.replace(dtype="bfloat16", steps=2)
# hsdp is zero3 on a grid (tests/jaxdp/strategies/test_hsdp.py): its own mutation there
TORCH_DISTRIBUTED = [s for s in registry.names("torch", oracle="single")
                     if s not in ("single", "hsdp", *JIT_STRATEGIES)]
JAX_DISTRIBUTED = [s for s in registry.names("jax", oracle="single") if s not in ("single", "hsdp", *JIT_STRATEGIES)]
TORCH_FLOATS = {"float", "double", "c10::BFloat16", "c10::Half"}
FUSED_STRATEGIES = ("ddp", "zero2", "zero3")  # --kernels fused's bf16: cast once (ddp, zero2), FSDP2's policy (zero3)
REPLICATED = [s for s in JAX_DISTRIBUTED if s != "zero3"]  # zero3 keeps no replica but Adam's count


@functools.cache
def torch_runs() -> dict:
    """One torch world of 2 ranks: the subset's runs and every strategy's collective dtypes in bf16."""
    dtypes = score.dtypes_job()
    items = score.torch_items(SUBSET) + [(BF16.replace(strategy=s), None, dtypes) for s in TORCH_DISTRIBUTED]
    items += [(BF16.replace(strategy=s, kernels="fused"), None, score.dtypes_job()) for s in FUSED_STRATEGIES]
    return pair_runs.run_torch(list(dict.fromkeys(items)))


@functools.cache
def evaluated() -> dict:
    return {r["case"][:3]: r for r in score.evaluate(SUBSET, torch=torch_runs())}


@pytest.mark.parametrize("case", SUBSET, ids="-".join)
def test_an_injected_bug_is_caught_by_every_required_check(case):
    result = evaluated()[case]
    assert not score.missed(result), (score.missed(result), result)


@functools.cache
def bf16_program(strategy: str):
    """`strategy`'s bf16 step compiled once: its collectives' dtypes, then two steps run with it and
    the replicas compared after each."""
    cfg = BF16.replace(strategy=strategy)
    compiled, dtypes = checks.compiled_step(cfg)
    return dtypes, checks.replica_mismatches(cfg, steps=2, compiled=compiled)


@pytest.mark.parametrize("strategy", JAX_DISTRIBUTED)
def test_jax_reduces_bf16_runs_gradients_in_fp32_in_the_compiled_program(strategy):
    """The fp32-reduction claim on the artifact that runs: every collective of the compiled bf16 step
    carries f32 (the bf16-reduction mutation, in the subset above, carries bf16 and fails this)."""
    dtypes, _ = bf16_program(strategy)
    assert dtypes, "no collective found"
    assert set().union(*dtypes.values()) == {"f32"}, dtypes


TEXT_MODEL = dict(data="text", n_layer=1, n_head=2, d_model=16, seq_len=8, accum=1)
# N = 3 keeps most of these small models' arrays whole; N = 4 splits them, where fsdp-jit's partitioner, left
# alone, chose a tensor-parallel schedule that reduced activations in bf16 (`step.build`'s `whole`)
JIT_BF16 = [(s, "mlp", "auto", 3) for s in JIT_STRATEGIES] + [
    (s, model, axis, 3) for s in JIT_STRATEGIES for model in ("gpt", "gpt2") for axis in ("auto", "explicit")] + [
    (s, "gpt2", "auto", 4) for s in JIT_STRATEGIES]
REDUCTIONS = ("all-reduce", "reduce-scatter", "all-to-all")  # all-to-all: explicit's trade of the gradient


def jit_bf16(strategy: str, model: str, axis_type: str, n: int = 3):
    cfg = BF16.replace(strategy=strategy, devices=n, batch_size=12 * n, axis_type=axis_type)
    return cfg if model == "mlp" else cfg.replace(model=model, **TEXT_MODEL)


def reductions(dtypes: dict) -> set:
    return set().union(*(kinds for op, kinds in dtypes.items() if op in REDUCTIONS))


@pytest.mark.parametrize("case", JIT_BF16, ids=lambda c: "-".join(map(str, c)))
def test_the_jit_strategies_reduce_bf16_runs_in_fp32_in_the_compiled_program(case):
    """The -jit forms, where the partitioner places every collective: every reduction carries f32 (gpt and
    gpt2 reduced part of the gradient in bf16 under `auto` before each device's gradient was taken apart:
    `step.plain_body`); a gather may carry the parameters already cast to bf16 (the same values)."""
    _, dtypes = checks.compiled_step(jit_bf16(*case))
    assert reductions(dtypes) == {"f32"}, dtypes
    assert set().union(*dtypes.values()) <= {"f32", "bf16"}, dtypes


@pytest.mark.parametrize("strategy", JAX_DISTRIBUTED)
def test_the_hand_written_strategies_reduce_gpt2s_bf16_gradient_in_fp32(strategy):
    """gpt2, whose weight gradients are bf16 products on each device: every collective of the hand-written
    strategies' bf16 step carries f32 (ddp-ring's sends are partial sums); dp's tree sends each leaf's own
    gradient on its first hop, bf16 values widened to fp32 and summed in fp32 by the receiver (exact, as
    docs/GPU.md says of the GPU program), which the mover's reading counts as bf16."""
    _, dtypes = checks.compiled_step(jit_bf16(strategy, "gpt2", "auto"))
    allowed = {op: {"f32", "bf16"} if (strategy, op) == ("dp", "collective-permute") else {"f32"} for op in dtypes}
    assert dtypes and all(kinds <= allowed[op] for op, kinds in dtypes.items()), dtypes


@pytest.mark.parametrize("strategy", ("ddp", "zero2", "zero3", "ddp-jit", "fsdp-jit"))
def test_the_fused_path_reduces_gpt2s_bf16_gradient_in_fp32_in_the_compiled_program(strategy):
    """--kernels fused casts the weights to bf16 once per step (jaxdp/models/cast_once.py), so each weight's
    gradient is a bf16 product until the cast's transpose: every reduction of the compiled step still carries
    f32, hand-written and partitioner-placed alike (a gather may carry the bf16 copies: the same values)."""
    _, dtypes = checks.compiled_step(jit_bf16(strategy, "gpt2", "auto").replace(kernels="fused"))
    assert reductions(dtypes) == {"f32"}, dtypes


def test_the_gpt2_check_fails_on_ddp_reducing_in_bf16():
    """The check above on gpt2 with the bf16-reduction bug injected (ddp casts the gradient to bf16 before its
    psum): XLA:CPU runs that psum widened, and the check reads it as bf16."""
    for kernels in ("mirrored", "fused"):
        with mutations.inject("jax", "bf16-reduction"):
            _, dtypes = checks.compiled_step(jit_bf16("ddp", "gpt2", "auto").replace(kernels=kernels))
        assert "bf16" in dtypes["all-reduce"], (kernels, dtypes)


def global_mean(loss_fn):
    """The bug: `auto`'s micro-batch gradient as it was, that of the global mean loss over the rows."""
    def rows(a):
        return a.reshape(a.shape[0] * a.shape[1], *a.shape[2:])
    return lambda params, x, y: jax.value_and_grad(loss_fn)(params, rows(x), rows(y))


def test_the_jit_fp32_reduction_check_fails_on_the_global_gradient(monkeypatch):
    """The check above, on the program as it was: gpt2's weight products reduced in bf16 (XLA:CPU runs them
    widened, `analysis/widened.py`), read as bf16 by the check and as `bf16>f32` by `jaxdp inspect`."""
    monkeypatch.setattr(jit_step, "device_mean", global_mean)
    compiled = accounting.compile_step(jit_bf16("ddp-jit", "gpt2", "auto"))
    assert "bf16" in reductions(checks.reduction_dtypes(compiled.program.as_text()))
    found = accounting.collectives(compiled.program.as_text(), 3)
    assert any("bf16>f32" in c["dtype"] and c["widened"] for c in found), [c["dtype"] for c in found]


@pytest.mark.parametrize("strategy", TORCH_DISTRIBUTED)
def test_torch_process_group_receives_fp32_tensors_in_bf16_runs(strategy):
    """Every tensor torch_ref's process group is handed in a bf16 run (gloo's own events: DDP's
    reducer buckets, FSDP's reduce-scatters, the rings' sends) is fp32 (integers: DDP's bucket indices)."""
    per_rank = torch_runs()[(BF16.replace(strategy=strategy), None, score.dtypes_job())]
    for seen in per_rank:
        assert set().union(*seen.values()) & TORCH_FLOATS == {"float"}, seen


@pytest.mark.parametrize("strategy", FUSED_STRATEGIES)
def test_torch_fused_bf16_reduces_in_fp32_and_gathers_only_bf16_parameters(strategy):
    """--kernels fused in bf16: every reduction the process group is handed is fp32 (the weights cast once
    change no gradient's dtype); only FSDP2's all-gather carries bf16, the parameters MixedPrecisionPolicy cast
    before gathering them (docs/KERNELS.md)."""
    per_rank = torch_runs()[(BF16.replace(strategy=strategy, kernels="fused"), None, score.dtypes_job())]
    for seen in per_rank:
        floats = {op: dtypes & TORCH_FLOATS for op, dtypes in seen.items() if dtypes & TORCH_FLOATS}
        assert all(d == {"float"} for op, d in floats.items() if op != "gloo:all_gather"), seen
        assert floats.get("gloo:all_gather", set()) <= ({"c10::BFloat16"} if strategy == "zero3" else {"float"}), seen


@pytest.mark.parametrize("strategy", REPLICATED)
def test_replicas_are_bitwise_identical_after_each_step(strategy):
    """Every device's copy of the parameters and optimizer state (dp: parameters only; ZeRO 1/2:
    parameters and the replicated step count) equals every other's bit for bit after each step."""
    assert bf16_program(strategy)[1] == []


def test_replica_check_catches_a_device_that_skips_weight_decay():
    """ddp-ring runs with replication unchecked (check_vma=False): if device 1 skips weight decay its
    replica silently diverges, and the trace (read from device 0) cannot show it."""
    cfg = mutations.config(mutations.REPLICA, "jax", "float32").replace(steps=2)
    with mutations.inject("jax", mutations.REPLICA.name):
        found = checks.replica_mismatches(cfg, steps=2)
    assert found and found[0].startswith("step 1: ['params']"), found
