"""What the user meant: a data-parallel layout, the accumulation steps, the dtype gradients are reduced in and
the dtype the parameters the step updates (its master copy, and the optimizer state) are held in.

The textbook collectives of each layout, per optimizer step, over the D data-parallel devices (P: the
parameters' elements):
    ddp    one all-reduce of the gradients (P) in the reduce dtype; no parameter gathers
    zero1  the gradients reduced (all-reduce or reduce-scatter), the optimizer state sharded, the parameters
           all-gathered once after the update
    zero2  a reduce-scatter of the gradients; the parameters all-gathered once after the update
    zero3  per-unit all-gathers for forward (and again for backward when resharding), once per micro-batch;
           a reduce-scatter of the gradients
    hsdp   zero3 within a shard group of S devices; an all-reduce of each gradient shard (P / S) across the
           R = D / S replica groups
    diloco no collective of the parameters on K - 1 of every K steps (`inner_steps`); on the K-th, one all-reduce
           of the parameters (P): 1/K of ddp's bytes per step
With accumulation k the gradient sync still happens once per step, not k times (zero3's gathers: k times).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError
from ..registry import strategies as registry

# the layouts: the strategies that are their own intent (jaxdp/core/registry/strategies.py), and what each shards
INTENTS = tuple(e.name for e in registry.ENTRIES if e.intent == e.name)
DTYPES = ("float32", "bfloat16", "float16", "float64")
SHARDS_PARAMS, SHARDS_GRADS, SHARDS_STATE = (tuple(s for s in INTENTS if registry.entry(s).shards[part])
                                             for part in range(3))
GRID = tuple(s for s in INTENTS if registry.entry(s).grid)  # the layouts over R replica groups (--replicas)
# the project's strategies (both frameworks) and what each means
OF_STRATEGY = {e.name: e.intent for e in registry.ENTRIES} | {a: registry.entry(a).intent for a in registry.ALIASES}

@dataclass(frozen=True)
class Intent:
    """`name` one of INTENTS; `accumulation` micro-batches per step; `reduce_dtype` the gradients'
    reduction dtype; `replicas` (hsdp) the R replica groups (0: read from the program's groups); `master_dtype` the
    dtype of the parameters the optimizer updates and of its floating state (Adam's moments); `inner_steps` (diloco)
    the K steps between the parameters' all-reduces (1: every step)."""
    name: str
    accumulation: int = 1
    reduce_dtype: str = "float32"
    replicas: int = 0
    master_dtype: str = "float32"
    inner_steps: int = 1

    def __post_init__(self):
        if self.name not in INTENTS:
            raise ConfigError(f"--intent {self.name!r} is not a data-parallel layout; use one of {', '.join(INTENTS)}")
        if not isinstance(self.accumulation, int) or self.accumulation < 1:
            raise ConfigError(f"--accumulation {self.accumulation!r} must be a whole number >= 1 (micro-batches per "
                              f"optimizer step)")
        if self.reduce_dtype not in DTYPES:
            raise ConfigError(f"--reduce-dtype {self.reduce_dtype!r} is not a dtype; use one of {', '.join(DTYPES)}")
        if self.replicas < 0 or (self.replicas and self.name not in GRID):
            raise ConfigError(f"--replicas {self.replicas} is for --intent {' or '.join(GRID)} (R >= 1 replica "
                              f"groups); drop it")
        if self.master_dtype not in DTYPES:
            raise ConfigError(f"--master-dtype {self.master_dtype!r} is not a dtype; use one of {', '.join(DTYPES)}")
        if not isinstance(self.inner_steps, int) or self.inner_steps < 1:
            raise ConfigError(f"--inner-steps {self.inner_steps!r} must be a whole number >= 1 (steps between the "
                              f"parameters' all-reduces)")


def of_strategy(strategy: str, accumulation: int = 1, reduce_dtype: str = "float32", replicas: int = 0,
                master_dtype: str = "float32", inner_steps: int = 1) -> Intent:
    """The intent a project strategy stands for (`OF_STRATEGY`); `inner_steps` kept where its `comm` is "outer"."""
    outer = registry.get(strategy, "comm") == "outer"
    return Intent(OF_STRATEGY[strategy], accumulation, reduce_dtype, replicas if OF_STRATEGY[strategy] in GRID else 0,
                  master_dtype, inner_steps if outer else 1)
