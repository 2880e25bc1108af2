"""What the bench runs: the models, device counts and strategies of each item, full or `--quick`."""
from __future__ import annotations

from dataclasses import dataclass

from ..config import FRAMEWORK_STRATEGIES, RunConfig

SHARED = tuple(s for s in FRAMEWORK_STRATEGIES["jax"] if s in FRAMEWORK_STRATEGIES["torch"])
JAX_ALL = FRAMEWORK_STRATEGIES["jax"]


@dataclass(frozen=True)
class Plan:
    """What to run: sizes, device counts and strategies per item."""
    quick: bool
    steps: int                      # per timed run: 1 compile + WARMUP_STEPS + the timed rest
    models: dict                    # label -> RunConfig (item 1-3, 6)
    time_ns: tuple                  # device counts for items 1-3
    time_strategies: tuple          # shared strategies timed (single always)
    comm_ns: tuple                  # items 4-5
    comm_strategies: tuple
    comm_model: RunConfig
    gpu_model: RunConfig
    gpu_steps: int
    coll_sizes_mb: tuple            # item 8: MB of float32 per device; N = time_ns
    coll_repeats: int


def plan(quick: bool) -> Plan:
    base = RunConfig(optimizer="adamw", dtype="float32", platform="cpu", seed=0, lr=1e-3)
    if quick:
        # A smoke run (the test suite's): one small model, one device count, every item present.
        models = {"mlp": base.replace(model="mlp", data="synthetic", hidden=(64, 64), batch_size=32)}
        return Plan(True, 4, models, (2,), ("single", "ddp", "ddp-ring"), (2,), ("ddp", "zero3"),
                    models["mlp"], _gpu_config(base), 4, (0.01,), 1)
    models = {"mlp": base.replace(model="mlp", data="synthetic", hidden=(1024, 1024), batch_size=512),
              "gpt": base.replace(model="gpt", data="text", n_layer=2, n_head=4, d_model=128, seq_len=64,
                                  batch_size=32)}
    return Plan(False, 12, models, (2, 4), SHARED, (2, 4, 8, 16), tuple(s for s in JAX_ALL if s != "single"),
                base.replace(model="mlp", data="synthetic", hidden=(1024, 1024), batch_size=256),
                _gpu_config(base), 30, (1, 4, 16, 64), 10)


def _gpu_config(base: RunConfig) -> RunConfig:
    return base.replace(model="gpt", data="text", strategy="single", devices=1, dtype="bfloat16", n_layer=12,
                        n_head=12, d_model=768, seq_len=1024, batch_size=16, platform="gpu")
