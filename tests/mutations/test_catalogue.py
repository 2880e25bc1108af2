"""The mutation catalogue's plumbing, without the runs (those: test_mutations.py): every bug injects into its
framework's code and is gone on exit; the scorer asks torch for the runs each case needs and reads a result;
a pair run's JAX side is `jaxdp train`'s run."""
from __future__ import annotations

import numpy as np
import pytest

from jaxdp.harness import pair_runs
from tests import mutations
from tests.conftest import BASE, run
from tests.mutations import score

CASES = [(m.name, fw) for m in mutations.CATALOGUE + [mutations.REPLICA] for fw in ("jax", "torch")
         if getattr(m, fw) is not None and m.name in mutations.planted(fw)]


@pytest.mark.parametrize("name, framework", CASES, ids="-".join)
def test_each_bug_injects_and_is_gone_on_exit(name, framework):
    from tests.mutations import jax_bugs
    from tests.mutations import torch_bugs as torch_mutations

    patches = (jax_bugs.PATCHES if framework == "jax" else torch_mutations.PATCHES)[name]()
    before = [getattr(obj, attr) for obj, attr, _ in patches]
    with mutations.inject(framework, name):
        assert all(getattr(obj, attr) is not b for (obj, attr, _), b in zip(patches, before, strict=True))
    assert all(getattr(obj, attr) is b for (obj, attr, _), b in zip(patches, before, strict=True))


def test_the_scorer_asks_for_the_honest_the_mutated_and_the_single_torch_runs():
    name = next(m.name for m in mutations.CATALOGUE if m.torch is not None)
    cfg = mutations.config(mutations.BY_NAME[name], "torch", "float64")
    items = score.torch_items([(name, "torch", "float64")])
    assert cfg in items and (cfg, mutations.Plant(name)) in items
    assert any(getattr(i, "strategy", None) == "single" for i in items)
    caught = {check: (True, "") for check in mutations.BY_NAME[name].checks}
    assert score.missed({"case": (name, "torch", "float64"), "caught": caught, "controls": {},
                         "located": (1, "grad", "layers/0/kernel")}) == []
    assert score.missed({"case": (name, "torch", "float64"), "caught": caught, "controls": {},
                         "located": None}) == ["not located within 20 steps"]


def test_a_pair_runs_jax_side_is_the_training_run():
    cfg = BASE.replace(steps=1)
    got, ref = pair_runs.run_jax(cfg), run(cfg)
    assert np.array_equal(got.arrays["step/1/loss"], ref.arrays["step/1/loss"])


def test_a_bug_no_tensor_exceeds_is_located_where_its_check_names_it():
    """A bf16 reduction in a bf16 run (every gradient element a bf16 value, no tensor beyond its bound) and one
    replica's skipped decay (seen by the replica check only) are located where the catching check names them;
    a check that caught nothing names nothing."""
    bf16 = ("bf16 values (jax: step/1/grad: 100% of the gradient elements are bfloat16 values (reduced in bf16, "
            "not fp32?))")
    assert score.named({"strategy": (True, bf16)}) == (1, "grad", "every grad tensor")
    replica = "step 1: ['params']['layers'][0]['kernel']: copies differ between devices"
    assert score.named({"replicas": (True, replica)}) == (1, "params (replicas)", "layers/0/kernel")
    assert score.named({"strategy": (False, "")}) is None
