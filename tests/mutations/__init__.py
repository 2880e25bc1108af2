"""Deliberate bugs, injected into real runs to prove that the checks catch them (a test-only hook).

Each mutation is a bug a data-parallel implementation can really have, written as a monkeypatch of
one function of the strategy code (`inject(framework, name)`, a context manager: the run is
trained inside it and the code is restored after). Nothing edits a trace: the bug runs, and its
trace, compiled program or replicas are then judged by the same checks as honest runs
(`jaxdp.judge.parity.judge` against `single` and against the other framework, the reduction dtype in
the compiled program or in what the torch process group receives, replica consistency).

`python -m tests.mutations --out docs/MUTATIONS.md` runs the whole catalogue in float64, float32 and
bfloat16, in both frameworks, and writes the table (bug x dtype x caught-by), a mutation score;
`--only NAME,...` and `--framework jax|torch` run parts of it alone.

The entry format (`Mutation`, one per bug class; both frameworks register here under the same name):
  name       the class's name, shared by jax_bugs.PATCHES and torch_bugs.PATCHES (the keys)
  bug        what the bug is, in a line
  cfg        the run on the project's own model (RunConfig; `strategy` is set per framework from `jax`/`torch`)
  jax, torch the strategy each framework's plant runs under (None: no such bug there)
  dtypes     the dtypes of the own-model cases (where the class is meaningful)
  checks     the checks that must catch it on the own model (score.py names them)
  source     where DP/ZeRO code has shipped this class: an issue, a paper, a changelog (URL or citation)
  hf         the transformers-config models it is also planted on (`jax_hf_models.FAMILIES`: jaxdp's llama from a
             Qwen2/Mistral/LlamaConfig, gpt2 from a GPT2Config; torch: transformers' own classes), () where
             the class has no meaning there (BatchNorm: no transformers-config model has one)
  hf_dtypes  the dtypes of those cases (float32 by default)
  hf_run     changes to those cases' run beyond `jax_hf_models.config`'s (AdamW, weight decay 0.1), e.g. the
             optimizer where the class lives in coupled weight decay
  where      a substring the located tensor must contain ('' : any tensor)
A case is (name, framework, dtype, model): model 'own' (cfg's model) or a family of `hf`. Every case must be
caught within 20 steps and LOCATED: the judge's first divergence (`divergence.compare(bad, honest single)`:
its step, field and tensor) is recorded and, with `where`, checked.
"""
from __future__ import annotations

import contextlib
from typing import NamedTuple

from jaxdp.core.run.config import RunConfig

from .runs import ADAM, CLIP, CNN, CNN_DTYPES, DTYPES, GPT2, HSDP, SGD, SMALL_DTYPES  # noqa: F401 (re-exported)
from .sources import cite


class Mutation(NamedTuple):
    name: str
    bug: str          # what the bug is, in a line
    cfg: RunConfig    # the run it is injected into (strategy set per framework)
    jax: str | None   # the jaxdp strategy it is injected into (None: no such bug there)
    torch: str | None
    dtypes: tuple = DTYPES  # where the bug exists
    checks: tuple = ("strategy", "parity")  # the checks that must catch it
    source: str = ""  # where the class has shipped: an issue, a paper, a changelog
    hf: tuple = ()  # transformers-config models it is planted on too (jax_hf_models.FAMILIES)
    hf_dtypes: tuple = ("float32",)
    hf_run: dict = {}  # noqa: RUF012 (read only)
    where: str = ""  # a substring of the tensor the judge must locate it at ('': any)


# transformers-config runs in coupled weight decay's optimizer, where the class lives there
SGD_RUN = dict(optimizer="sgd", lr=0.05, weight_decay=0.5)

CATALOGUE = [
    Mutation("missing-1/N", "gradients all-reduced (summed) but never divided by N", ADAM, "ddp", "ddp-ring",
             hf=("llama",)),
    Mutation("summed-twice", "gradients summed twice: the shard_map implicit-psum trap (jax: no pcast before grad; "
             "torch: an all-reduce on top of DDP's)", ADAM, "ddp", "ddp", hf=("mistral",)),
    Mutation("clip-shard-norm", "ZeRO clips by the norm of the device's shard, not of the whole gradient",
             CLIP, "zero2", "zero3", hf=("qwen2",)),
    Mutation("accum-K-1", "the accumulated micro-batch gradients divided by K - 1 instead of K", ADAM, "ddp", "ddp",
             hf=("llama",)),
    Mutation("stale-grads", "gradients kept across steps (the buffer is never zeroed)", SGD, "ddp", "ddp",
             hf=("gpt2",)),
    Mutation("decay-one-shard", "weight decay skipped on one shard of the optimizer (device 1)", SGD, "zero2", "zero2",
             hf=("qwen2",), hf_run=SGD_RUN),
    Mutation("bucket-twice", "one bucket all-reduced twice", ADAM, "ddp-bucket", "ddp-bucket", hf=("mistral",)),
    Mutation("bf16-reduction", "gradients reduced in bf16 instead of fp32 (cast before the all-reduce)", ADAM,
             "ddp", "ddp", checks=("strategy", "parity", "program"), hf=("llama",)),
    Mutation("bn-local-stats", "cnn: --batchnorm sync normalises with each device's own rows' statistics (no "
             "cross-device mean and variance)", CNN, "ddp", "ddp", dtypes=CNN_DTYPES),
    Mutation("bn-no-backward-reduce", "cnn: sync BatchNorm's backward all-reduce removed (the statistics are "
             "global in forward, but each device's gradient misses the other devices' rows' dependence on them)",
             CNN, "zero2", "ddp", dtypes=CNN_DTYPES),
    Mutation("lr-1.00001x", "the learning rate 1.00001x on one weight tensor (gpt2's fused qkv kernel), every "
             "step", GPT2,
             "ddp", "ddp", dtypes=SMALL_DTYPES, hf=("gpt2",)),
    Mutation("decay-skipped-once", "AdamW's weight decay skipped on one tensor (the fused qkv kernel) at step 2",
             GPT2, "ddp", "ddp", dtypes=SMALL_DTYPES, hf=("gpt2",)),
    Mutation("adam-eps-1e-6", "Adam's eps 1e-6 instead of 1e-8", GPT2, "ddp", "ddp", dtypes=SMALL_DTYPES,
             hf=("qwen2",)),
    Mutation("one-element", "one element's update 1.00001x (the fused qkv kernel's first, at step 2)", GPT2,
             "ddp", "ddp", dtypes=SMALL_DTYPES, hf=("gpt2",)),
    Mutation("hsdp-wrong-axis", "hsdp reduces the gradients within its group only (over `data`), never across the "
             "groups (`replica`): each group steps with its own half of the batch", HSDP, "hsdp", "hsdp",
             dtypes=SMALL_DTYPES, hf=("llama",)),
    Mutation("zero-gather-offset", "a ZeRO-3 / FSDP parameter all-gathered at the wrong offset: the shards "
             "rotated by one", ADAM, "zero3", "zero3", dtypes=SMALL_DTYPES, hf=("mistral",)),
    Mutation("clip-before-reduce", "each device clips its local gradient by its own norm before the all-reduce",
             CLIP, "ddp", "ddp", dtypes=SMALL_DTYPES, hf=("qwen2",)),
    Mutation("loss-scale-kept", "a static loss scale (1024) multiplies the loss and is never divided out of the "
             "gradients", ADAM, "ddp", "ddp", hf=("gpt2",)),
    Mutation("decay-wrong-set", "weight decay masked to the matrices (biases and norm scales excluded) where the "
             "run decays every tensor", GPT2, "ddp", "ddp", dtypes=SMALL_DTYPES, hf=("llama",)),
    Mutation("adam-beta-typo", "Adam's beta2 0.99 for 0.999", GPT2, "ddp", "ddp", dtypes=SMALL_DTYPES, hf=("mistral",)),
    Mutation("tied-grad-once", "a tied weight (GPT-2's wte: embedding and head) takes the gradient of one use "
             "only (zero3 treats it as each unit's own)", GPT2, "zero3", "zero3", dtypes=SMALL_DTYPES,
             hf=("qwen2", "gpt2")),
    Mutation("overlapping-rows", "the data sharded with overlapping rows: device i reads rows shifted by one "
             "into i+1's", ADAM, "ddp", "ddp", dtypes=SMALL_DTYPES, hf=("llama",)),
    Mutation("stale-micro-batch", "gradient accumulation reads micro-batch 0's gradient twice and the last "
             "one's never", ADAM, "ddp", "ddp", dtypes=SMALL_DTYPES, hf=("mistral",)),
    Mutation("bucket-missing-1/N", "one bucket (the first) summed but not divided by N", ADAM, "ddp-bucket",
             "ddp-bucket", hf=("qwen2",)),
    Mutation("leaf-skipped", "one parameter's gradient never all-reduced (the reducer's hook for it never "
             "fires): it keeps the device's local gradient", ADAM, "ddp-ring", "ddp", hf=("gpt2",)),
]
# A bug the trace cannot see (the trace reads device 0's copy): the replica check's own mutation.
REPLICA = Mutation("decay-one-replica", "weight decay skipped on one device's replica (ddp-ring, whose shard_map "
                   "runs with replication unchecked)", SGD, "ddp-ring", None, checks=("replicas",),
                   hf=("llama",), hf_run=SGD_RUN)
CATALOGUE = [m._replace(source=m.source or cite(m.name)) for m in CATALOGUE]  # sources.py: one place for them all
REPLICA = REPLICA._replace(source=cite(REPLICA.name))
BY_NAME = {m.name: m for m in CATALOGUE + [REPLICA]}


def planted(framework: str) -> set:
    """The classes `framework`'s bugs module plants (the keys of its PATCHES)."""
    if framework == "jax":
        from . import jax_bugs

        return set(jax_bugs.PATCHES)
    from . import torch_bugs

    return set(torch_bugs.PATCHES)


class Plant(NamedTuple):
    """Bug `name` as `pair_runs` takes it: `inject(framework)` is the context manager that plants it."""
    name: str

    def inject(self, framework: str):
        return inject(framework, self.name)


def plant(name: str | None) -> Plant | None:
    return None if name is None else Plant(name)


def inject(framework: str, name: str):
    """A context manager under which `framework`'s code has bug `name`."""
    if framework == "jax":
        from . import jax_bugs

        return _patched(jax_bugs.PATCHES[name]())
    from . import torch_bugs

    return _patched(torch_bugs.PATCHES[name]())


@contextlib.contextmanager
def _patched(patches):
    """Set each (object, attribute, value); restore them all on exit."""
    saved = [(obj, attr, getattr(obj, attr)) for obj, attr, _ in patches]
    try:
        for obj, attr, value in patches:
            setattr(obj, attr, value)
        yield
    finally:
        for obj, attr, value in reversed(saved):
            setattr(obj, attr, value)


def config(m: Mutation, framework: str, dtype: str, kernels: str = "mirrored") -> RunConfig:
    """The run of mutation `m` in `framework`, `dtype` and `kernels` (docs/KERNELS.md)."""
    return m.cfg.replace(strategy=m.jax if framework == "jax" else m.torch, dtype=dtype, kernels=kernels)
