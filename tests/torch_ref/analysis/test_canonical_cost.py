"""torch_ref/analysis/canonical_cost.py: canonical against native, measured side by side. In this process,
on a tiny mlp at N = 1 (`single`: no process group), one interleaved round: the two modes' medians and
temporaries come back, and a row says the ratio of what was measured (the worlds of N ranks are what
`measure_canonical_cost` adds; docs/CANONICAL.md has the table it gave)."""
from __future__ import annotations

import pytest
import torch

from torch_ref.analysis import canonical_cost


def test_one_rank_measures_both_modes_and_the_row_is_their_ratio():
    cfg = canonical_cost.MODELS["mlp"].replace(hidden=(16,), batch_size=32, strategy="single", shards=4)
    threads = torch.get_num_threads()
    view = canonical_cost.compare_rank(0, 1, cfg, repeats=1, warmup=0, threads=1)
    torch.set_num_threads(threads)
    assert len(view["step_s"]) == 2 and min(view["step_s"]) > 0
    assert len(view["temp_bytes"]) == 2 and view["temp_bytes"][1] > 0  # canonical allocates its shards' gradients
    row = canonical_cost.row(cfg, 1, [view])
    assert row["shards"] == 4 and row["ratio"] == view["step_s"][1] / view["step_s"][0]
    assert "| mlp | single | 1 | 4 |" in canonical_cost.table([row])


def test_the_slowest_rank_counts():
    cfg = canonical_cost.MODELS["mlp"].replace(strategy="ddp", shards=8)
    views = [{"step_s": [1.0, 3.0], "temp_bytes": [10, 30]}, {"step_s": [2.0, 2.5], "temp_bytes": [99, 99]}]
    row = canonical_cost.row(cfg, 2, views)
    assert (row["native_step_s"], row["canonical_step_s"], row["ratio"]) == (2.0, 3.0, 1.5)
    assert row["temp_ratio"] == 3.0 and row["shards"] == 8


def test_a_size_the_shards_cannot_take_is_one_line_before_any_world(monkeypatch, capsys):
    """The cnn at its batch of 64 has S = 1, which N = 2 does not divide: argparse's one error line, exit 2."""
    monkeypatch.setattr(canonical_cost, "measure_canonical_cost", lambda *a: pytest.fail("a world was started"))
    with pytest.raises(SystemExit) as stop:
        canonical_cost.main(["--model", "cnn", "--strategies", "ddp", "--devices", "1", "2"])
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and "needs n to divide shards=1" in err[-1]
