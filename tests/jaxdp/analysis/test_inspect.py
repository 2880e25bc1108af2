"""`jaxdp inspect`: the JSON keys are a contract; the values are the compiled step's."""
from __future__ import annotations

import json

import pytest

from jaxdp.analysis import inspect
from jaxdp.harness import cli
from jaxdp.strategies.bucket import MB
from tests.conftest import BASE

OP_KEYS = {"op", "dtype", "elements", "group_size", "inter_group", "bytes_per_device", "trips"}
TOP_KEYS = {"collectives", "bytes_per_device", "theory_bytes_per_device", "state_bytes", "temp_bytes", "peak_bytes",
            "replicas", "bytes_intra_group", "bytes_inter_group", "theory_bytes_intra_group",
            "theory_bytes_inter_group"}


def test_inspect_ddp_bucket_lists_one_all_reduce_per_bucket_and_the_plan(tmp_path):
    path = tmp_path / "inspect.json"
    argv = ["inspect", "--model", "mlp", "--hidden", "16,16", "--strategy", "ddp-bucket", "--devices", "4",
            "--batch-size", "72", "--dtype", "float32", "--bucket-mb", str(2200 / MB), "--json", str(path)]
    assert cli.main(argv) == 0
    r = json.loads(path.read_text())
    assert TOP_KEYS | {"buckets"} <= set(r)
    assert all(set(c) == OP_KEYS for c in r["collectives"])
    assert all(c["group_size"] == 4 and not c["inter_group"] for c in r["collectives"])  # one group of 4
    assert r["bytes_intra_group"] == r["bytes_per_device"] and r["bytes_inter_group"] == 0
    reduces = [c["elements"] for c in r["collectives"] if c["op"] == "all-reduce" and c["elements"] > 1]
    assert reduces == r["buckets"] and len(r["buckets"]) > 1
    assert r["bytes_per_device"] == pytest.approx(r["theory_bytes_per_device"], rel=1e-12)
    assert r["peak_bytes"] >= r["state_bytes"] + r["temp_bytes"] > 0


@pytest.mark.parametrize("strategy", ["dp", "ddp-ring", "zero2"])
def test_inspect_totals_are_the_sum_over_collectives_and_trips(strategy):
    r = inspect.inspect(BASE.replace(strategy=strategy, devices=2, accum=3, dtype="float32"))
    assert TOP_KEYS <= set(r) and "buckets" not in r
    assert {c["op"] for c in r["collectives"]} <= {"all-reduce", "reduce-scatter", "all-gather", "collective-permute",
                                                    "all-to-all"}
    assert r["bytes_per_device"] == pytest.approx(sum(c["bytes_per_device"] * c["trips"] for c in r["collectives"]))
    # dp included: its theory counts the loss in the tree (reduced to device 0, broadcast back)
    assert r["bytes_per_device"] == pytest.approx(r["theory_bytes_per_device"], rel=1e-12)
    assert "stats_bytes_per_device" not in r  # no running statistics: no second program
