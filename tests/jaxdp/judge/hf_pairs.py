"""Honest pairs of transformers' own models for the judge's tests (tests/jaxdp/judge/test_resolution.py):
GPT-2 (LayerNorm) and Llama (RMSNorm) from tests/mutations/hf_honest.py's tiny configs, AdamW at
lr 1e-3 (the norm scales' hard case: ulp(1) against an update of 1e-3), torch_ref ddp on 2 ranks against
`single`, 4 steps. The rank side runs here, `pairs` launches the two worlds once per process."""
from __future__ import annotations

import functools

LR, STEPS, MODELS = 1e-3, 4, ("gpt2", "llama")


def world(rank: int, n: int, cases: list) -> list:
    """hf_honest.run_world with AdamW at LR (its own default is 1e-2)."""
    from tests.mutations import hf_honest

    hf_honest.LR["adamw"] = LR
    return hf_honest.run_world(rank, n, cases)


def _cases(strategy: str, n: int, dtype: str) -> list:
    return [dict(model=m, optimizer="adamw", dtype=dtype, steps=STEPS, strategy=strategy, devices=n) for m in MODELS]


@functools.cache
def pairs(dtype: str) -> dict:
    """{model: (ddp on 2 ranks, single)} as trace.Trace pairs, with the optimizer's settings in meta."""
    from jaxdp.core.traces import trace
    from torch_ref.launch import launch

    ddp = launch(world, 2, _cases("ddp", 2, dtype), timeout_s=600, pg_timeout_s=120)[0]
    single = launch(world, 1, _cases("single", 1, dtype), timeout_s=600, pg_timeout_s=120)[0]
    return {m: (trace.Trace(*a), trace.Trace(*b)) for m, a, b in zip(MODELS, ddp, single, strict=True)}
