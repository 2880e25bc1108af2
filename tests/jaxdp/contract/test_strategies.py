"""The contract beside the project's own programs: `jaxdp inspect` prints it and writes it under 'contract';
`jaxdp compare`'s line says kept or names the departures; a GPU target's program says what overlaps."""
from __future__ import annotations

import json

import pytest

from jaxdp.contract import strategies
from jaxdp.core.run import targets
from jaxdp.harness import cli


def test_inspect_prints_the_contract_and_writes_it(tmp_path, capsys):
    path = tmp_path / "i.json"
    assert cli.main(["inspect", "--strategy", "zero1", "--devices", "2", "--model", "mlp", "--json", str(path)]) == 0
    out = capsys.readouterr().out
    assert "communication contract: intent zero1" in out and "OK: the program communicates as zero1 intends" in out
    contract = json.loads(path.read_text())["contract"]
    assert contract["ok"] and {c["op"] for c in contract["collectives"]} >= {"all-reduce", "all-gather"}


@pytest.mark.quick
def test_compares_line_says_kept_or_names_the_departures():
    kept = {"ok": True, "intent": "ddp", "findings": []}
    departs = {"ok": False, "intent": "ddp", "findings": [{"kind": "sync-per-microbatch"}, {"kind": "reduce-dtype"}]}
    assert strategies.note(kept) == "; contract ddp kept"
    assert strategies.note(departs) == "; contract ddp DEPARTS: sync-per-microbatch, reduce-dtype"


@pytest.mark.skipif(not targets.extra_installed(), reason='needs pip install -e ".[gpu-aot]"')
def test_a_gpu_target_says_what_overlaps(tmp_path):
    """XLA:GPU's scheduler runs collectives as start/done pairs: the overlap column reads yes or no there (the
    CPU's synchronous collectives read '?')."""
    path = tmp_path / "i.json"
    cli.main(["inspect", "--strategy", "ddp", "--devices", "8", "--model", "mlp", "--target", "h100", "--json",
              str(path)])
    contract = json.loads(path.read_text())["contract"]
    assert contract["ok"], contract["findings"]
    assert all(c["overlaps"] in (True, False) for c in contract["collectives"])


@pytest.mark.parametrize("name,dtype,kind", [("bf16-reduction", "float32", "reduce-dtype"),
                                             ("bf16-reduction", "bfloat16", "reduce-dtype"),
                                             ("summed-twice", "float32", "sync-per-microbatch")])
def test_the_projects_planted_communication_bugs_break_its_contract(name, dtype, kind):
    """The mutation catalogue's bugs that change what is sent (docs/MUTATIONS.md), planted in the project's own
    step: the gradients reduced in bf16; shard_map's implicit psum on top of the explicit one, inside the
    accumulation loop (accum 3), so the gradient is reduced once per micro-batch."""
    from jaxdp.analysis import accounting
    from tests import mutations

    m = next(m for m in mutations.CATALOGUE if m.name == name)
    cfg = m.cfg.replace(strategy=m.jax, devices=4, batch_size=48, dtype=dtype).validate()
    with mutations.inject("jax", name):
        report = strategies.of_compiled(accounting.compile_step(cfg), cfg)
    assert kind in [f.kind for f in report.findings], report.to_text()
    honest = strategies.of_compiled(accounting.compile_step(cfg), cfg)
    assert honest.ok, honest.to_text()  # the same step without the bug
    assert honest.facts["held_dtypes"] == {"parameters": ["float32"], "optimizer state": ["float32"]}  # bf16 too
