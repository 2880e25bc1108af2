"""zero3 is FSDP by units in the *compiled* program (post-optimisation HLO, XLA:CPU), not only in
the jaxpr: per unit and micro-batch a forward all-gather, a backward all-gather and a reduce-scatter,
in schedule order and interleaved with compute; no re-gather with reshard_after_forward=False; the
bytes of the theory; and an in-step peak (memory_analysis) below zero2's and at most half of ddp's
on a parameter-dominated model. The last tests break the strategy on purpose (the value ties
removed) and show that these checks then fail."""
from __future__ import annotations

import functools
import math
import re

import jax
import numpy as np
import optax
import pytest

from jaxdp import api, models
from jaxdp.analysis import accounting, hlo
from jaxdp.models import unit_vjp
from jaxdp.models import units as unit_lib
from tests.conftest import BASE

N = 4
MLP = BASE.replace(strategy="zero3", devices=N, dtype="float32", batch_size=24, hidden=(64, 48), optimizer="adam")
GPT = MLP.replace(model="gpt", data="text", n_layer=2, d_model=16, n_head=2, seq_len=8)
# The bytes tests' gpt: one block (embedding, block, head: every kind of unit and parameter); the schedule-order
# tests keep GPT's two blocks, where a block's gathers must interleave with its neighbour's matmuls.
GPT_BYTES = GPT.replace(n_layer=1)
# Parameters dominate: Psi = 1.86M (7.4 MB in fp32) against 2 rows x ~4.1k activations per device.
WIDE = BASE.replace(devices=N, dtype="float32", batch_size=8, hidden=(512,) * 8, optimizer="adam")
_CALLS = re.compile(r"\bcalls=(%[^\s,)]+)")


@functools.cache
def compiled(cfg) -> accounting.CompiledStep:
    return accounting.compile_step(cfg)


def unit_table(problem, n):
    """Per unit, in forward order: (name, elements gathered, elements of its gradient shard, has a matmul)."""
    table = []
    for unit in problem.units:
        leaves = unit_lib.split(problem.params, [unit])
        shard = sum(math.ceil(leaf.size / n) for leaf in jax.tree.leaves(leaves))
        matmul = any(name.endswith("kernel") for name in models.flat_names(leaves))  # not the embeddings
        table.append((unit.name, n * shard, shard, matmul))
    return table


def program(text: str, n: int) -> list[tuple[str, int]]:
    """The entry computation in schedule order: ('all-gather' | 'reduce-scatter', elements) for each
    of those collectives, ('matmul', 0) for each instruction that runs a dot, nothing for the rest."""
    entry, comps = hlo.computations(text)

    @functools.cache
    def runs_dot(line):
        return bool(re.search(r" (dot|convolution)\(|__cublas", line)) or any(
            runs_dot(inner) for callee in _CALLS.findall(line) for inner in comps.get(callee[1:], []))

    tokens = []
    for line in comps[entry]:
        c = hlo.collective(line, n)
        if c is not None and c["op"] in ("all-gather", "reduce-scatter"):
            tokens.append((c["op"], c["elements"]))
        elif runs_dot(line):
            tokens.append(("matmul", 0))
    return tokens


def expected_events(table, reshard: bool) -> list[tuple[str, int]]:
    """FSDP's order: every unit gathered for forward; then, in reverse, gathered again (reshard)
    and its gradient reduce-scattered."""
    forward = [("all-gather", i) for i in range(len(table))]
    backward = []
    for i in reversed(range(len(table))):
        backward += ([("all-gather", i)] if reshard else []) + [("reduce-scatter", i)]
    return forward + backward


def match(tokens, table, expected) -> list[int]:
    """Consume `tokens` event by event (an event: consecutive collectives of one op whose elements
    add up to the unit's); return the matmuls run before each event. AssertionError on a mismatch."""
    matmuls, i, out = 0, 0, []
    for k, (op, unit) in enumerate(expected):
        name, gathered, shard, _ = table[unit]
        want, got = (gathered if op == "all-gather" else shard), 0
        while got < want:
            assert i < len(tokens), f"event {k} ({op} of {name}): the program has no more collectives"
            kind, elements = tokens[i]
            i += 1
            if kind == "matmul":
                matmuls += 1 if got == 0 else 0
                continue
            assert kind == op, f"event {k}: expected {op} of {name}, found {kind} of {elements} elements"
            got += elements
        assert got == want, f"event {k}: {op} of {name} should move {want} elements, found {got}"
        out.append(matmuls)
        matmuls = 0
    left = [t for t in tokens[i:] if t[0] != "matmul"]
    assert not left, f"collectives after the last expected event: {left}"
    return out


def check_fsdp_order(cfg, compile=compiled):
    c = compile(cfg)
    table = unit_table(c.problem, cfg.devices)
    expected = expected_events(table, cfg.reshard_after_forward)
    before = match(program(c.program.as_text(), cfg.devices), table, expected)
    for (op, unit), (prev_op, prev), matmuls in zip(expected[1:], expected[:-1], before[1:], strict=True):
        name = table[unit][0]
        if op == "all-gather" and prev_op == "all-gather" and prev < unit and table[prev][3]:
            assert matmuls, f"forward gather of {name} scheduled before {table[prev][0]}'s forward ran"
        if op == "reduce-scatter" and prev_op == "all-gather" and table[unit][3]:
            assert matmuls, f"reduce-scatter of {name} before its backward ran"


@pytest.mark.parametrize("reshard", [True, False])
@pytest.mark.parametrize("cfg", [MLP, GPT], ids=["mlp", "gpt"])
def test_each_unit_is_gathered_run_and_reduce_scattered_in_schedule_order(cfg, reshard):
    """mlp: 3 units (layers); gpt: embed, 2 blocks, head. Gathers interleave with the matmuls."""
    check_fsdp_order(cfg.replace(reshard_after_forward=reshard))


def test_reshard_false_runs_no_regather():
    """The order check can fail: the reshard=False program has no backward gathers."""
    cfg = MLP.replace(reshard_after_forward=False)
    c = compiled(cfg)
    table = unit_table(c.problem, N)
    with pytest.raises(AssertionError, match="expected all-gather"):
        match(program(c.program.as_text(), N), table, expected_events(table, reshard=True))


@pytest.mark.parametrize("model", ["mlp", "gpt"])
@pytest.mark.parametrize("n,accum,reshard", [(2, 1, True), (3, 3, True), (4, 1, False), (4, 3, False), (3, 1, True)])
def test_bytes_equal_theory(model, n, accum, reshard):
    """Bytes sent per device per step, read from the compiled HLO (loop bodies x their trips), equal
    the theory by kind: all-gather (N-1)/N Psi x accum x (2 with reshard, 1 without), one
    reduce-scatter. With reshard and accum 1: 3 (N-1)/N Psi in all."""
    check_bytes((MLP if model == "mlp" else GPT_BYTES).replace(devices=n, accum=accum, reshard_after_forward=reshard,
                                                          batch_size=n * accum * 2))


def check_bytes(cfg, compile=compiled):
    n, c = cfg.devices, compile(cfg)
    measured = accounting.communication(c.program.as_text(), n)
    sizes = [p.size for p in jax.tree.leaves(c.problem.params)]
    expected = accounting.theory("zero3", sizes, n, 4, accum=cfg.accum, reshard_after_forward=cfg.reshard_after_forward)
    for kind in ("all-reduce", "reduce-scatter", "all-gather", "point-to-point"):
        assert measured[kind]["sent"] == pytest.approx(expected[kind], rel=1e-12), (kind, measured, expected)


@pytest.mark.parametrize("reshard", [True, False])
def test_accumulation_gathers_every_micro_batch_and_reduce_scatters_once(reshard):
    """FSDP's no_sync: with accum 3 every leaf is gathered 3 (or 6, reshard) times per step, and its
    gradient reduce-scattered once, outside the micro-batch loop
    (cnn: tests/jaxdp/analysis/test_model_accounting.py)."""
    cfg = MLP.replace(accum=3, reshard_after_forward=reshard)
    c = compiled(cfg)
    found = hlo.collectives_in_order(c.program.as_text(), N)
    leaves = jax.tree.leaves(c.problem.params)
    gathered = sorted(N * math.ceil(p.size / N) for p in leaves)
    runs = {}
    for col in found:
        if col["op"] == "all-gather":
            runs[col["elements"]] = runs.get(col["elements"], 0) + col["trips"]
    assert sorted(runs) == sorted(set(gathered))
    per_leaf = 3 * (2 if reshard else 1)
    assert all(runs[e] == per_leaf * gathered.count(e) for e in runs), runs
    scatters = [col for col in found if col["op"] == "reduce-scatter"]
    assert len(scatters) == len(leaves) and all(col["trips"] == 1 for col in scatters), scatters


def peaks(wide) -> dict:
    return {(s, r): accounting.step_memory(compiled(wide.replace(strategy=s, reshard_after_forward=r)).program)
            ["peak_bytes"] for s, r in [("ddp", True), ("zero1", True), ("zero2", True), ("zero3", True),
                                        ("zero3", False)]}


def peak_bound(wide) -> int:
    """zero3's peak formula: the sharded state (b_p + b_g + K) Psi / N with the batch, plus at most
    two units' full parameters and gradients in flight, plus activations (a few copies of each
    layer's output, per row)."""
    c = compiled(wide.replace(strategy="zero3"))
    per_device = sum(math.ceil(p.size / N) for p in jax.tree.leaves(c.problem.params))
    largest = max(gathered for _, gathered, _, _ in unit_table(c.problem, N))
    rows, widths = wide.batch_size // N, 32 + sum(wide.hidden) + 10
    return 4 * (4 * per_device + rows * 32 + 2 * 2 * largest + 4 * rows * widths)


def test_peak_memory_ddp_zero1_zero2_zero3_on_a_parameter_dominated_model():
    p = peaks(WIDE)
    assert p["ddp", True] > p["zero1", True] > p["zero2", True] > p["zero3", True], p
    assert p["zero3", True] <= p["ddp", True] / 2, p
    assert p["zero3", True] <= peak_bound(WIDE), (p, peak_bound(WIDE))
    assert p["zero3", False] > p["zero3", True], "reshard_after_forward=False keeps the gathered parameters"


def test_the_checks_fail_without_the_value_ties(monkeypatch):
    """The mutation: `unit_vjp.tie` (zero3's value ties) as the identity, or as an optimization barrier
    (which XLA:CPU's cse_barrier_expander removes). XLA then merges the backward re-gather into the
    forward one (CSE) and schedules every gather first: the order, bytes and peak checks above all fail."""
    def fresh(cfg):  # not the cache: these programs are broken on purpose
        return accounting.compile_step(cfg)

    zero2 = peaks(WIDE)["zero2", True]
    for broken in (lambda tree, dep: tree, lambda tree, dep: jax.lax.optimization_barrier((tree, dep))[0]):
        monkeypatch.setattr(unit_vjp, "tie", broken)
        with pytest.raises(AssertionError, match="expected all-gather|before"):
            check_fsdp_order(MLP, compile=fresh)
        with pytest.raises(AssertionError):
            check_bytes(MLP, compile=fresh)
        peak = accounting.step_memory(fresh(WIDE.replace(strategy="zero3")).program)["peak_bytes"]
        assert peak > zero2 and peak > peak_bound(WIDE), (peak, zero2, peak_bound(WIDE))


def plain_loss_step(accum: int):
    """zero3 on a plain `loss_fn` (one unit, `units.whole`) at N = 4, compiled: (HLO text, leaves)."""
    def loss_fn(params, x, y):
        logits = jax.numpy.tanh(x @ params["w1"]) @ params["w2"]
        return jax.numpy.mean(optax.softmax_cross_entropy_with_integer_labels(logits, y))

    key = jax.random.key(0)
    params = {"w1": jax.random.normal(key, (6, 8), "float32"), "w2": jax.random.normal(key, (8, 3), "float32")}
    par = api.parallelize(loss_fn, params, optax.sgd(0.1), strategy="zero3", devices=N, accum=accum)
    x, y = np.ones((N * accum * 2, 6), "float32"), np.zeros(N * accum * 2, "int32")
    state = par.init()
    text = par.compiled_step.lower(state, *par.put_batch(x, y)).compile().as_text()
    return text, jax.tree.leaves(params)


def check_gathers_twice_per_micro_batch(accum: int):
    text, leaves = plain_loss_step(accum)
    found = hlo.collectives_in_order(text, N)
    gathers = sum(c["trips"] for c in found if c["op"] == "all-gather")
    assert gathers == 2 * accum * len(leaves), f"{gathers} all-gathers per step, not 2 x {accum} x {len(leaves)}"
    assert sum(c["trips"] for c in found if c["op"] == "reduce-scatter") == len(leaves), found


def test_a_plain_loss_under_accumulation_gathers_twice_per_micro_batch(monkeypatch):
    """The whole loss as one unit: its cotangent is the constant 1/A in every micro-batch, so a
    re-gather tied to it alone is the same value in every micro-batch, and XLA hoists it out of the
    accumulation loop (merged with the first micro-batch's). Tied to the micro-batch too
    (`unit_vjp.regather_after`), every micro-batch gathers twice: 2 A all-gathers per leaf, one
    reduce-scatter. The mutation: tied to the cotangent alone, the check fails (A + 1 per leaf)."""
    check_gathers_twice_per_micro_batch(accum=3)
    monkeypatch.setattr(unit_vjp, "regather_after", lambda dy, mark: dy)
    with pytest.raises(AssertionError, match="8 all-gathers per step, not 2 x 3 x 2"):
        check_gathers_twice_per_micro_batch(accum=3)
