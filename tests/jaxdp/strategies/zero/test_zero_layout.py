"""ZeRO's layout table (jaxdp/strategies/zero/layout.py): the stages' semantics in one place, what the
memory formula reads, and what docs/ZERO.md renders."""
from __future__ import annotations

from pathlib import Path

from jax.sharding import PartitionSpec as P

from jaxdp.analysis import accounting
from jaxdp.devices import AXIS
from jaxdp.strategies.zero import layout
from tests import REPO

DOCS = Path(REPO) / "docs" / "ZERO.md"


def test_each_stage_shards_what_zero_says():
    """Stage k shards the last k of (params, grads, optimizer state), read from the table's rows (hsdp:
    stage 3 within a group)."""
    for name, row in layout.LAYOUTS.items():
        assert name == f"zero{row.stage}" or (name == "hsdp" and row.sharded == layout.ZERO3.sharded)
        assert [row.shards_opt_state, row.shards_grads, row.shards_params] == [i < row.stage for i in range(3)]
    assert not any(layout.REPLICATED.sharded.values()) and layout.of("ddp") is layout.REPLICATED


def test_the_specs_follow_from_what_is_sharded():
    assert [row.param_spec for row in layout.LAYOUTS.values()] == [P(), P(), P(AXIS), P(AXIS)]
    assert [row.grad_spec for row in layout.LAYOUTS.values()] == [P(), P(AXIS), P(AXIS), P(AXIS)]
    assert [row.gathers_after_update for row in layout.LAYOUTS.values()] == [True, True, False, False]
    assert not layout.REPLICATED.gathers_after_update


def test_the_memory_formula_reads_the_table():
    sizes, n = [10, 3], 4  # Psi 13, Psi / N padded 3 + 1 = 4
    got = {name: accounting.formula(layout.of(name), sizes, n, 1, 1, 1) for name in ("ddp", "zero1", "zero2", "zero3")}
    assert got == {"ddp": {"params": 13, "grads": 13, "opt_state": 13},
                   "zero1": {"params": 13, "grads": 13, "opt_state": 4},
                   "zero2": {"params": 13, "grads": 4, "opt_state": 4},
                   "zero3": {"params": 4, "grads": 4, "opt_state": 4}}
    assert {name: accounting.STAGE[name] for name in layout.LAYOUTS} == {"zero1": 1, "zero2": 2, "zero3": 3, "hsdp": 3}


def test_the_docs_render_every_row():
    text = DOCS.read_text()
    assert "## ZeRO's layouts, declared once" in text and "jaxdp/strategies/zero/layout.py" in text
    for row in layout.LAYOUTS.values():
        assert row.torch in text and row.why in text, row.stage
