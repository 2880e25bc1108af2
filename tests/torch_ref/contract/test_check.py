"""`torch_ref.check` in a gloo world of 2 ranks (spawned once for the module): each seeded misconfiguration
(seeded_torch.CASES, with its public source) caught with its kind, first; the honest twins, every torch_ref
strategy (built by `torch_ref.parallelize`) and a transformers GPT-2 under torch's own DDP and FSDP2 pass."""
from __future__ import annotations

import pytest

from . import seeded_torch

pytestmark = pytest.mark.filterwarnings("ignore")


@pytest.fixture(scope="module")
def reports():
    from torch_ref.launch import launch

    return launch(seeded_torch.run, 2, timeout_s=600, pg_timeout_s=120)[0]


SEEDED = sorted(n for n, case in seeded_torch.CASES.items() if case[0])
HONEST = sorted(n for n, case in seeded_torch.CASES.items() if not case[0])
PROJECT = [f"torch_ref {s} accum {k}" for s in seeded_torch.PROJECT for k in (1, 2)] + [
    f"torch_ref {s} bf16" for s in seeded_torch.PROJECT]
GPT2 = [f"transformers gpt2 under {w}" for w in ("ddp", "fsdp2")]


@pytest.mark.parametrize("name", SEEDED)
def test_a_seeded_misconfiguration_is_caught_with_its_kind(reports, name):
    kind, *_, source = seeded_torch.CASES[name]
    r = reports[name]
    assert not r["ok"] and r["findings"][0]["kind"] == kind, (source, r["findings"], r["collectives"])
    assert all(f["message"] and f["fix"] for f in r["findings"])


@pytest.mark.parametrize("name", HONEST + PROJECT + GPT2)
def test_an_honest_program_passes(reports, name):
    if name in GPT2:
        pytest.importorskip("transformers")
    r = reports[name]
    assert r["ok"], (r["findings"], r["collectives"])


def test_what_the_process_group_ran_is_read(reports):
    """FSDP2 in float32 on gloo: reduce-scatters asked for and run as all-reduces (gloo has none); the
    bf16 policy without reduce_dtype reduces in bfloat16, with it in float32; DDP's bucket overlaps nothing
    in so small a model (one bucket, issued with the last gradient) and no finding is made of it."""
    fsdp = reports["fsdp2"]["collectives"]
    assert {c["op"] for c in fsdp} >= {"all-gather", "reduce-scatter"}
    assert all(c["ran_as"] == "all-reduce" for c in fsdp if c["op"] == "reduce-scatter")
    reduced = {c["dtype"] for c in reports["fsdp2-bf16-reduce-dtype-not-set"]["collectives"]
               if c["op"] == "reduce-scatter"}
    assert reduced == {"bfloat16"}
    assert {c["dtype"] for c in reports["fsdp2-bf16-reduce-dtype-float32"]["collectives"]
            if c["op"] == "reduce-scatter"} == {"float32"}
    (bucket,) = [c for c in reports["ddp"]["collectives"] if c["elements"] > 1]
    assert (bucket["op"], bucket["count"], bucket["overlaps"]) == ("all-reduce", 1, False)


@pytest.fixture(scope="module")
def hsdp_reports():
    from torch_ref.launch import launch

    return launch(seeded_torch.run_hsdp, 4, timeout_s=600, pg_timeout_s=120)[0]


def test_hsdp_on_a_world_of_4(hsdp_reports):
    """2 replicas of 2 shards: FSDP2 on a 1-D mesh where HSDP was meant is caught (every collective over the
    world); FSDP2 on a (replicate, shard) mesh and torch_ref's hsdp keep the contract."""
    kind, *_, source = seeded_torch.HSDP_CASES["fsdp2-1d-mesh-where-hsdp-was-meant"]
    bad = hsdp_reports["fsdp2-1d-mesh-where-hsdp-was-meant"]
    assert bad["findings"][0]["kind"] == kind, (source, bad["findings"])
    for name in ("fsdp2-2d-mesh", "torch_ref hsdp"):
        r = hsdp_reports[name]
        assert r["ok"], (name, r["findings"], r["collectives"])
        assert {c["axis"] for c in r["collectives"] if c["op"] == "reduce-scatter"} == {"shard"}
        assert "replicate" in {c["axis"] for c in r["collectives"] if c["op"] == "all-reduce"}
