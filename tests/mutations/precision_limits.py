"""The judge on float64 transformers models with float32 sites (docs/PARITY.md, "Precision census"): honest
ddp on 2 ranks against single (AdamW, 3 steps; recorded with `torch_ref.trace.Recorder`, which takes the
precision census), as the models are and under `torch_ref.precision.keep_float64()`, and per tensor the smallest
relative error the judge fails for each bug of tests/mutations/limits.py and one more:

  wrong-grad  the tensor's gradient 1 + d times itself at step 2 and the updates from it (the optimizer
              replayed on the changed gradient: a gradient bug the update follows, not only the record).

    python -m tests.mutations.precision_limits

Gemma's RMSNorm multiplies by (1 + weight) in float32, so its norm scales' gradients are float32 sums: an
honest float64 ddp run and a single one differ there by ~1e-8 (the float64 bound is 1e-12). Llama's
(hf_honest's config) upcasts too, but scales in float64.
"""
from __future__ import annotations

import contextlib

import numpy as np

from jaxdp.core.traces import trace
from jaxdp.judge import error_model

from . import limits

STEPS, BATCH = 3, 12
PREFIX = {"gemma": "model.", "llama": "model."}
CASES = (("gemma", False), ("gemma", True), ("llama", False))  # (model, under keep_float64)
BUGS = limits.BUGS + ("wrong-grad",)


def hf_model(name: str):
    """A tiny float64 transformers model (eager attention), the same weights every call."""
    import torch
    import transformers as hf

    from . import hf_honest

    if name != "gemma":
        return hf_honest.hf_model(name, "float64")
    torch.manual_seed(0)
    return hf.GemmaForCausalLM(hf.GemmaConfig(
        vocab_size=hf_honest.VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=4, max_position_embeddings=hf_honest.SEQ,
        attn_implementation="eager")).to(torch.float64)


def record(name: str, strategy: str, rank: int, n: int, keep: bool = False):
    """One AdamW run of `name`; rank 0's (meta, arrays), the others None."""
    import torch

    import torch_ref

    from . import hf_honest

    with torch_ref.precision.keep_float64() if keep else contextlib.nullcontext():
        model, opt = torch_ref.parallelize(hf_model(name), strategy=strategy,
                                           optimizer=lambda ps: torch.optim.AdamW(ps, lr=1e-2))
        rows = slice(rank * BATCH // n, (rank + 1) * BATCH // n)
        meta = {"model": f"hf-{name}", "dtype": "float64", "strategy": strategy, "devices": n, "steps": STEPS,
                "clip_norm": 0.0}
        with torch_ref.trace.Recorder(None, meta, model, strip_prefix=PREFIX[name], optimizer=opt) as rec:
            rec.init()
            for k in range(1, STEPS + 1):
                x, y = hf_honest.batch("llama", k, "float64")
                loss = torch_ref.train_step(model, opt, torch.from_numpy(x[rows]), torch.from_numpy(y[rows]),
                                            hf_honest.loss_fn)
                rec.step(k, loss, x, y)
    return (rec.meta, rec.arrays) if rank == 0 else None


def run_cases(rank: int, n: int) -> dict:
    """Every case under ddp on n ranks: {(model, keep_float64): rank 0's (meta, arrays)}."""
    return {(name, keep): record(name, "ddp", rank, n, keep) for name, keep in CASES}


def pairs(n: int = 2) -> dict:
    """{case: (ddp on n ranks, single)} as traces."""
    from torch_ref.launch import launch

    world = launch(run_cases, n, timeout_s=300, pg_timeout_s=120)[0]
    return {case: (trace.Trace(*world[case]), trace.Trace(*record(case[0], "single", 0, 1, case[1])))
            for case in CASES}


def wrong_grad(t: trace.Trace, step: int, name: str, d: float) -> trace.Trace:
    """`t` with `name`'s gradient at `step` 1 + d times itself and its parameters moved by what that changes of the
    replayed updates (meta's optimizer) from `step` on, each step's replay from the parameters already moved."""
    opt = error_model.optimizer_of(t.meta)
    before = error_model.replay(t, opt, [name])
    changed, shift = limits.scaled_grad(t, step, name, d), 0.0
    for k in range(step, t.steps + 1):
        shift = shift + (error_model.replay(changed, opt, [name])[k][name] - before[k][name])
        key = f"step/{k}/param/{name}"
        moved = (t.arrays[key].astype(np.float64) + shift).astype(t.arrays[key].dtype)
        shift = moved.astype(np.float64) - t.arrays[key].astype(np.float64)  # what storing it kept
        changed = trace.Trace(t.meta, {**changed.arrays, key: moved})
    return changed


def edit(bug: str, name: str, step: int = 2):
    if bug == "wrong-grad":
        return lambda t, d: wrong_grad(t, step, name, d)
    return limits.edit(bug, name, step)


def table(a: trace.Trace, b: trace.Trace) -> dict:
    """{bug: {tensor: the smallest d caught}}."""
    return {bug: {n: limits.smallest_caught(a, b, edit(bug, n)) for n in b.names()} for bug in BUGS}


def main(argv=None) -> int:
    found = pairs()
    rows = {keep: table(*found[("gemma", keep)]) for keep in (False, True)}
    print("| tensor | " + " | ".join(f"{bug} ({'keep_float64' if keep else 'census'})" for keep in rows
                                     for bug in BUGS) + " |")
    print("|---" * (1 + 2 * len(BUGS)) + "|")
    for n in rows[False]["lr"]:
        print(f"| {n} | " + " | ".join(f"{rows[keep][bug][n]:.0e}" for keep in rows for bug in BUGS) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
