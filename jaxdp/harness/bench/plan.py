"""What the bench runs: the models, device counts and strategies of each item, full or `--quick`."""
from __future__ import annotations

from dataclasses import dataclass

from ...core.config import FRAMEWORK_STRATEGIES, JIT_STRATEGIES, RunConfig

# hsdp is left out: at the default --replicas 1 it is zero3, and it runs no cnn (BatchNorm)
SHARED = tuple(s for s in FRAMEWORK_STRATEGIES["jax"] if s in FRAMEWORK_STRATEGIES["torch"] and s != "hsdp")
JAX_ALL = tuple(s for s in FRAMEWORK_STRATEGIES["jax"] if s != "hsdp")
HAND = tuple(s for s in JAX_ALL if s not in JIT_STRATEGIES)  # the -jit ones run no BatchNorm and no canonical
JIT_PAIRS = (("ddp", "ddp-jit"), ("zero1", "zero1-jit"), ("zero3", "fsdp-jit"))  # hand-written, -jit (item 10)


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
    model_comm: tuple = ()          # items 4-5 for the models users port: (label, RunConfig, strategies, Ns)
    reduction_model: RunConfig | None = None  # item 9: --reduction canonical vs native
    reduction_strategies: tuple = ()  # (strategy, collectives or None); single runs at N = 1
    reduction_ns: tuple = ()
    reduction_repeats: int = 0      # interleaved timed calls of each mode
    reduction_fma: bool = False     # also time native in a process with FMA on (the flag's own cost)
    reduction_bn_model: RunConfig | None = None  # item 9's cnn (sync BatchNorm: a statistics program too)
    reduction_bn_strategies: tuple = ()
    reduction_bn_ns: tuple = ()
    jit_model: RunConfig | None = None  # item 10: hand-written vs -jit, at N = max(time_ns)
    jit_pairs: tuple = ()
    jit_accums: tuple = ()


def plan(quick: bool) -> Plan:
    base = RunConfig(optimizer="adamw", dtype="float32", platform="cpu", seed=0, lr=1e-3)
    if quick:
        # A smoke run (the test suite's): one small model, one device count, every item present; cnn and
        # gpt2 only in the compiled items (no timed run: no torch world to spawn), tiny, N = 2, ddp (zero3's
        # compiles cost twice as much; tests/jaxdp/analysis/test_model_accounting.py and test_gpt2.py cover it),
        # gpt2 on the character text (its 50304-token vocabulary alone would double this smoke run).
        models = {"mlp": base.replace(model="mlp", data="synthetic", hidden=(64, 64), batch_size=32)}
        ported = (("cnn", _cnn(base, (4, 8), 32), ("ddp",), (2,)),
                  ("gpt2", _gpt2(base, 1, 2, 16, 16, 8).replace(data="text"), ("ddp",), (2,)))
        return Plan(True, 4, models, (2,), ("single", "ddp", "ddp-ring"), (2,), ("ddp", "zero3"),
                    models["mlp"], _gpu_config(base), 4, (0.01,), 1, ported,
                    base.replace(model="mlp", data="synthetic", hidden=(16,), batch_size=16),
                    (("ddp", None), ("zero1", "xla")), (2,), 3, False, _cnn(base, (2, 4), 16), (("ddp", None),),
                    (2,), models["mlp"], JIT_PAIRS[:1], (2,))
    models = {"mlp": base.replace(model="mlp", data="synthetic", hidden=(1024, 1024), batch_size=512),
              "gpt": base.replace(model="gpt", data="text", n_layer=2, n_head=4, d_model=128, seq_len=64,
                                  batch_size=32),
              "cnn": _cnn(base, (32, 64), 256),
              "gpt2": _gpt2(base, 2, 4, 128, 64, 32)}
    strategies = tuple(s for s in JAX_ALL if s != "single")
    hand = tuple(s for s in HAND if s != "single")
    ported = (("cnn", models["cnn"], hand, (2, 4, 8)), ("gpt2", models["gpt2"], hand, (2, 4, 8)),
              ("llama", _llama(base, 2, 4, 2, 128, 64, 32), hand, (2, 4, 8)))
    comm_model = base.replace(model="mlp", data="synthetic", hidden=(1024, 1024), batch_size=256)
    return Plan(False, 12, models, (2, 4), SHARED, (2, 4, 8, 16), strategies, comm_model,
                _gpu_config(base), 30, (1, 4, 16, 64), 10, ported, comm_model,
                tuple(_with_collectives(HAND)), (4, 8), 10, True, _cnn(base, (8, 16), 64),
                (("single", None), ("ddp", None), ("zero3", "xla")), (2, 4),
                base.replace(model="mlp", data="synthetic", hidden=(1024, 1024), batch_size=64), JIT_PAIRS, (1, 4))


def _with_collectives(strategies: tuple):
    """(strategy, collectives): ZeRO once with XLA's collectives and once with the explicit ring."""
    for s in strategies:
        yield from ((s, c) for c in ("xla", "ring")) if s.startswith("zero") else ((s, None),)


def _cnn(base: RunConfig, channels: tuple, batch: int) -> RunConfig:
    """`--model cnn` on digits with synchronised BatchNorm (its statistics' all-reduces are counted)."""
    return base.replace(model="cnn", data="digits", channels=channels, batchnorm="sync", batch_size=batch)


def _gpt2(base: RunConfig, n_layer: int, n_head: int, d_model: int, seq_len: int, batch: int) -> RunConfig:
    """`--model gpt2` (tied wte) on the package's GPT-2-vocabulary tokens."""
    return base.replace(model="gpt2", data="tokens", n_layer=n_layer, n_head=n_head, d_model=d_model,
                        seq_len=seq_len, batch_size=batch)


def _llama(base: RunConfig, n_layer: int, n_head: int, n_kv_head: int, d_model: int, seq_len: int,
           batch: int) -> RunConfig:
    """`--model llama` (grouped-query attention, untied head) on the same tokens, items 4-5 only."""
    return base.replace(model="llama", data="tokens", n_layer=n_layer, n_head=n_head, n_kv_head=n_kv_head,
                        d_model=d_model, seq_len=seq_len, batch_size=batch)


def _gpu_config(base: RunConfig) -> RunConfig:
    return base.replace(model="gpt", data="text", strategy="single", devices=1, dtype="bfloat16", n_layer=12,
                        n_head=12, d_model=768, seq_len=1024, batch_size=16, platform="gpu")
