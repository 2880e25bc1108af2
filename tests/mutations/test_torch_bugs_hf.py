"""The bug classes new to torch_ref (`torch_sync_bugs`, `torch_step_bugs`), each planted once on a transformers
model (`hf_bugs`: transformers' own GPT-2 with its tied head, or Llama with grouped-query attention and RMSNorm,
built from tiny configs, trained through `torch_ref.parallelize` and recorded with the Recorder, AdamW with
torch's defaults) in float32 at N = 2 for 2 steps, all in one spawned world: each bug's run is caught by the
judge (`divergence.compare`, its default bounds) against the honest run of the same strategy and located to its
first (step, field, tensor). (The honest runs' controls against `single`: `python -m
tests.mutations.hf_bugs`, which runs every class on every family.)"""
from __future__ import annotations

import functools

import pytest

pytest.importorskip("transformers")

from tests.mutations import hf_bugs, torch_bugs  # noqa: E402

STEPS = 2
# class: (model, the first divergence: step, field, and the tensor's name or a test of it (None: any tensor))
EXPECTED = {
    "hsdp-wrong-axis": ("gpt2", 1, "grad", None),
    "zero-gather-offset": ("llama", 1, "param", None),
    "clip-before-reduce": ("gpt2", 1, "grad", None),
    "loss-scale-kept": ("llama", 1, "grad", None),
    "decay-wrong-set": ("gpt2", 1, "param", lambda t: t.endswith(("scale", "bias"))),  # an undecayed 1-D tensor
    "adam-beta-typo": ("llama", 2, "param", None),  # beta2 first matters in step 2's second moment
    "tied-grad-once": ("gpt2", 1, "grad", "wte/embedding"),  # the tied weight
    "overlapping-rows": ("llama", 1, "loss", "loss"),
    "stale-micro-batch": ("gpt2", 1, "loss", "loss"),
    "bucket-missing-1/N": ("gpt2", 1, "grad", None),
    "leaf-skipped": ("llama", 1, "grad", "lm_head/kernel"),  # the parameter DDP was told to ignore (the last)
}


@functools.cache
def verdicts() -> dict:
    todo = [(name, hf_bugs.case(name, model, steps=STEPS)) for name, (model, *_) in EXPECTED.items()]
    return {r["name"]: r for r in hf_bugs.judge(todo, n=2, controls=False)}


def test_every_new_class_has_a_torch_plant_and_a_run():
    assert set(EXPECTED) <= set(torch_bugs.PATCHES) and set(EXPECTED) <= set(hf_bugs.RUNS)


@pytest.mark.parametrize("name", list(EXPECTED))
def test_the_bug_is_caught_and_located(name):
    model, step, field, tensor = EXPECTED[name]
    r = verdicts()[name]
    assert r["model"] == model and r["caught"], r
    assert r["where"][:2] == (step, field), r["detail"]
    if tensor is not None:
        assert tensor(r["where"][2]) if callable(tensor) else r["where"][2] == tensor, r["detail"]


@pytest.mark.parametrize("argv, flag", [(["--steps", "x"], "--steps"), (["--steps", "21"], "--steps"),
                                        (["--dtype", "bfloat16"], "--dtype"), (["--only", "no-such-bug"], "--only")])
def test_a_bad_flag_is_one_line_and_exit_2_before_any_run(argv, flag, capsys):
    assert hf_bugs.main(argv) == 2
    out = capsys.readouterr().out.strip()
    assert "\n" not in out and out.startswith(flag), out


def test_the_page_counts_the_cases_and_names_each_first_divergence():
    results = [{"name": "leaf-skipped", "model": "gpt2", "strategy": "ddp", "caught": True,
                "where": (1, "grad", "ln_f/bias"), "detail": "", "control": ""},
               {"name": "adam-beta-typo", "model": "llama", "strategy": "ddp", "caught": False, "where": None,
                "detail": "", "control": None}]
    text = hf_bugs.page(results, "python -m tests.mutations.hf_bugs", 1.0, "float32", 4)
    assert "**1 of 2 cases caught and located.**" in text
    assert "| leaf-skipped | gpt2 | ddp | yes | 1, grad, ln_f/bias | pass |" in text
    assert "| adam-beta-typo | llama | ddp | NO | none | not run |" in text
    assert "https://github.com/pytorch/pytorch/issues/69031" in text  # the torch plant's source
