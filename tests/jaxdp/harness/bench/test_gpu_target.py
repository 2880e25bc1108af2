"""Bench item 12's plan and table (the compiles themselves: tests/jaxdp/analysis/test_gpu_target.py and the
full `jaxdp bench`)."""
from __future__ import annotations

from jaxdp.harness.bench import gpu_target

ROW = {"model": "llama", "strategy": "zero3", "devices": 8, "nodes": 1, "peak_bytes": 2**35, "fits": True,
       "bytes_per_device": 3.0, "theory_bytes_per_device": 4.0, "overlap_flops": 1e12, "projected_step_s": 0.5,
       "projected_mfu": 0.42, "step_low_s": 0.45, "step_high_s": 0.6}


def test_the_plan_covers_every_strategy_on_one_and_two_nodes():
    full = gpu_target.cases()
    gpt2 = {(c.strategy, c.devices, nodes) for c, nodes in full if c.model == "gpt2"}
    assert {s for s, _, _ in gpt2} == set(gpu_target.STRATEGIES)
    assert {(n, nodes) for _, n, nodes in gpt2} == {(8, 1), (16, 2)}
    assert all(c.batch_size == c.devices for c, _ in full if c.model == "llama")  # one 2048-token row per GPU
    assert "skipped" in gpu_target.gpu_projection(True, print)  # --quick: the suite's bench has no minutes


def test_the_table_labels_the_projection_and_says_why_it_skipped():
    text = "\n".join(gpu_target.section({"gpu_projection": {"rows": [ROW], "published": ["x"]}}))
    # the projection as the range its calibration supports (one figure where the ends differ by over a fifth)
    assert "PROJECTED" in text and "| llama | zero3 | 8 | 1 | 32.0 | yes | 0.750 | 1e+12 | 400-600 | 30-50 |" in text
    skipped = gpu_target.section({"gpu_projection": {"skipped": "needs the gpu-aot extra"}})
    assert skipped[-1] == "needs the gpu-aot extra"


def test_the_full_bench_compiles_the_headline_rows_only():
    """42 compiles take over an hour on 2 cores: `jaxdp bench` runs the three rows behind the claims (Llama 3 8B
    ddp does not fit 8 H100s, zero3 does; GPT-2 124M ddp beside llm.c's MFU), the module every row."""
    rows = [(c.model, c.strategy, c.devices) for c, _ in gpu_target.cases()]
    assert len(rows) == 42 and set(gpu_target.IN_BENCH) <= set(rows)
