"""What the bench runs: the models, device counts and strategies of each item, full or `--quick`."""
from __future__ import annotations

from dataclasses import dataclass

from ...core.registry import strategies as registry
from ...core.run.config import FRAMEWORK_STRATEGIES, JIT_STRATEGIES, RunConfig

# hsdp (the grid) is left out: at the default --replicas 1 it is zero3, and it runs no cnn (BatchNorm); so is a
# strategy whose oracle is its own reference, not another strategy (diloco: local SGD changes the algorithm)
JAX_ALL = tuple(s for s in FRAMEWORK_STRATEGIES["jax"] if not registry.entry(s).grid
                and registry.entry(s).oracle in registry.BY_NAME)
SHARED = tuple(s for s in JAX_ALL if s in FRAMEWORK_STRATEGIES["torch"])
HAND = tuple(s for s in JAX_ALL if s not in JIT_STRATEGIES)  # the -jit ones run no BatchNorm and no canonical
JIT_PAIRS = tuple((registry.entry(s).twin, s) for s in JIT_STRATEGIES)  # (hand-written, -jit): item 10
# the bench's picks by their rows: ddp (replicated, one all-reduce), single (one device), zero3 (all sharded)
REPLICATED, ONE_DEVICE, FULLY_SHARDED = registry.REPLICATED, registry.ONE_DEVICE, registry.FULLY_SHARDED


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
    reduction_more: tuple = ()      # item 9's other rows: (label, RunConfig, ((strategy, collectives), ...), Ns)
    jit_model: RunConfig | None = None  # item 10: hand-written vs -jit, at N = max(time_ns)
    jit_pairs: tuple = ()
    jit_accums: tuple = ()
    time_ns_of: tuple = ()          # items 1-3: (model label, its device counts) where not `time_ns`
    steps_of: tuple = ()            # items 1-3: (model label, its steps per timed run) where not `steps`
    kernels: tuple = ("mirrored",)  # items 1-3: the --kernels paths each framework is timed on (bench --kernels)
    torch_compile: bool = False     # items 1-3: torch.compile on the torch side (bench --compile)
    fused_model: RunConfig | None = None  # item 13: fused / mirrored step time, per framework
    fused_runs: tuple = ()          # item 13: (dtype, strategy, N) of every row
    fused_repeats: int = 0          # item 13: interleaved calls of each path


# item 13's rows; --quick keeps the first and the last (float32 single, bf16 ddp at 2: every dtype and strategy once)
FUSED_RUNS = tuple((d, s, n) for d in ("float32", "bfloat16") for s, n in ((ONE_DEVICE, 1), (REPLICATED, 2)))


def plan(quick: bool, kernels: tuple = ("mirrored",), torch_compile: bool = False) -> Plan:
    """The bench's plan, full or `quick`; `kernels`: the paths items 1-3 time (item 13 always measures both),
    `torch_compile`: their torch runs under torch.compile."""
    base = RunConfig(optimizer="adamw", dtype="float32", platform="cpu", seed=0, lr=1e-3)
    if quick:
        # A smoke run (the test suite's): one small model, one device count, every item present; cnn and
        # gpt2 only in the compiled items (no timed run: no torch world to spawn), tiny, N = 2, ddp (zero3's
        # compiles cost twice as much; tests/jaxdp/analysis/test_model_accounting.py and test_gpt2.py cover it),
        # gpt2 on the character text (its 50304-token vocabulary alone would double this smoke run).
        models = {"mlp": base.replace(model="mlp", data="synthetic", hidden=(64, 64), batch_size=32)}
        tiny = _gpt2(base, 1, 2, 16, 16, 8).replace(data="text")  # item 13's too
        ported = (("cnn", _cnn(base, (4, 8), 32), (REPLICATED,), (2,)), ("gpt2", tiny, (REPLICATED,), (2,)))
        return Plan(True, 4, models, (2,), (ONE_DEVICE, REPLICATED, "ddp-ring"), (2,), (REPLICATED, FULLY_SHARDED),
                    models["mlp"], _gpu_config(base), 4, (0.01,), 1, ported,
                    base.replace(model="mlp", data="synthetic", hidden=(16,), batch_size=16, shards=4),
                    ((REPLICATED, None), ("zero1", "xla")), (2,), 3, False, _cnn(base, (2, 4), 16).replace(shards=4),
                    ((REPLICATED, None),), (2,), (), models["mlp"], JIT_PAIRS[:1], (2,), kernels=kernels,
                    torch_compile=torch_compile, fused_model=tiny, fused_runs=FUSED_RUNS[::3], fused_repeats=3)
    models = {"mlp": base.replace(model="mlp", data="synthetic", hidden=(1024, 1024), batch_size=512),
              "gpt": base.replace(model="gpt", data="text", n_layer=2, n_head=4, d_model=128, seq_len=64,
                                  batch_size=32),
              "cnn": _cnn(base, (32, 64), 256),
              "gpt2": _gpt2(base, 2, 4, 128, 64, 8)}  # batch 8: the 50257-way logits dominate its step
    strategies = tuple(s for s in JAX_ALL if s != ONE_DEVICE)
    hand = tuple(s for s in HAND if s != ONE_DEVICE)
    # the models users port: compiled at N = 8 (the mlp's rows give N = 2 to 16; docs/BENCHMARKS.md, the cuts)
    ported = (("cnn", models["cnn"], hand, (8,)), ("gpt2", models["gpt2"], hand, (8,)),
              ("llama", _llama(base, 2, 4, 2, 128, 64, 32), hand, (8,)))
    comm_model = base.replace(model="mlp", data="synthetic", hidden=(1024, 1024), batch_size=256)
    # item 9 at the default S (the mlp's 4 at batch 256: every strategy at N = 4, ddp at 2; the gpt's 4)
    # and at S = 16 (a quarter of the work per shard), kept to ~25 rows for the full bench's time
    few, ddp = ((ONE_DEVICE, None), (REPLICATED, None), (FULLY_SHARDED, "xla")), ((REPLICATED, None),)
    more = (("mlp", comm_model, ddp, (2,)), ("gpt", models["gpt"], few, (4,)), ("gpt", models["gpt"], ddp, (2,)),
            ("mlp S=16", comm_model.replace(shards=16), ddp, (4,)), ("gpt S=16", models["gpt"].replace(shards=16),
                                                                    ddp, (4,)))
    return Plan(False, 12, models, (2, 4), SHARED, (2, 4, 8, 16), strategies, comm_model,
                _gpu_config(base), 30, (1, 4, 16, 64), 10, ported, comm_model,
                tuple(_with_collectives(HAND)), (4,), 8, True, _cnn(base, (8, 16), 256), few, (2, 4), more,
                base.replace(model="mlp", data="synthetic", hidden=(1024, 1024), batch_size=64), JIT_PAIRS, (1, 4),
                (("gpt", (4,)), ("cnn", (4,)), ("gpt2", (4,))),  # timed at N = 4 (and single): the mlp keeps 2 and 4
                (("gpt2", 8),),  # gpt2's 50257-way logits: 0.4-0.5 s a step, a third of items 1-3's timed steps
                kernels, torch_compile, models["gpt2"], FUSED_RUNS, 8)


def time_runs(p: Plan):
    """Items 1-3: (model label, N, [RunConfig]) in order; single at N = 1, the others at each N, each on every
    path of `p.kernels`; the -jit strategies only on models without BatchNorm (they run none: the cnn)."""
    for label, base in p.models.items():
        for n in (1,) + tuple(dict(p.time_ns_of).get(label, p.time_ns)):
            names = [ONE_DEVICE] if n == 1 else [s for s in p.time_strategies if s != ONE_DEVICE
                                               and not (base.model == "cnn" and s in JIT_STRATEGIES)]
            for k in p.kernels:
                steps = steps_of(p, label)
                yield label, n, [base.replace(strategy=s, devices=n, steps=steps, kernels=k, compile=p.torch_compile)
                                 for s in names]


def steps_of(p: Plan, label: str) -> int:
    """Items 1-3: the steps of each timed run of model `label`."""
    return dict(p.steps_of).get(label, p.steps)


def comm_runs(p: Plan):
    """Items 4-5: (model, key prefix, RunConfig) in order."""
    runs = [(p.comm_model.model, "", p.comm_model, p.comm_strategies, p.comm_ns)]
    runs += [(label, f"{label}:", cfg, strategies, ns) for label, cfg, strategies, ns in p.model_comm]
    for model, prefix, base, strategies, ns in runs:
        for name in strategies:
            for n in ns:
                yield model, prefix, base.replace(strategy=name, devices=n)


def reduction_models(p: Plan) -> dict:
    """Item 9's models by label: the mlp, the cnn with sync BatchNorm when the plan has it, the others."""
    bn = {} if p.reduction_bn_model is None else {"cnn": p.reduction_bn_model}
    return {"mlp": p.reduction_model} | bn | {label: cfg for label, cfg, *_ in p.reduction_more}


def reduction_runs(p: Plan):
    """Item 9: (model label, RunConfig, strategy, collectives, N) of every row, in order."""
    groups = (("mlp", p.reduction_strategies, p.reduction_ns), ("cnn", p.reduction_bn_strategies, p.reduction_bn_ns))
    groups += tuple((label, strategies, ns) for label, _, strategies, ns in p.reduction_more)
    for label, strategies, ns in groups:
        for strategy, coll in strategies:
            for n in (1,) if strategy == ONE_DEVICE else ns:
                yield label, reduction_models(p)[label], strategy, coll, n


def torch_reduction_runs(p: Plan):
    """Item 9's torch side: (model label, RunConfig, strategy, N) of every row whose strategy torch_ref has
    (once per strategy: torch has no `--collectives`), in the jaxdp rows' order."""
    seen = set()
    for label, base, strategy, _, n in reduction_runs(p):
        if strategy in FRAMEWORK_STRATEGIES["torch"] and (label, strategy, n) not in seen:
            seen.add((label, strategy, n))
            yield label, base, strategy, n


def reduction_configs(base: RunConfig, strategy: str, collectives: str | None, n: int, modes: tuple) -> list:
    """Item 9's pair: `base` in each mode (its --shards for canonical only: native takes none)."""
    extra = {} if collectives is None else {"collectives": collectives}
    return [base.replace(strategy=strategy, devices=n, reduction=m, shards=base.shards if m == "canonical" else 0,
                         **extra) for m in modes]


def every_config(p: Plan):
    """(item, framework, RunConfig) of every run the plan makes (items 1-5, 9, 10, 13): what the CLI would
    check first (`RunConfig.validate`), so a test can refuse a plan that asks for a refused run."""
    for _, _, cfgs in time_runs(p):
        for c in cfgs:
            yield "time", "jax", c
            yield "time", "torch", c
    for _, _, c in comm_runs(p):
        yield "comm", "jax", c
    for _, base, strategy, coll, n in reduction_runs(p):
        for c in reduction_configs(base, strategy, coll, n, ("native", "canonical")):
            yield "reduction", "jax", c
    for _, base, strategy, n in torch_reduction_runs(p):
        for c in reduction_configs(base, strategy, None, n, ("native", "canonical")):
            yield "reduction", "torch", c
    for _, c in jit_configs(p):
        yield "jit", "jax", c
    for dtype, strategy, n in p.fused_runs:
        for k in ("mirrored", "fused"):
            for framework in ("jax", "torch"):
                yield "fused", framework, p.fused_model.replace(dtype=dtype, strategy=strategy, devices=n, kernels=k)


def jit_configs(p: Plan):
    """Item 10: (pair label, RunConfig) at N = the largest timed device count, per accumulation: the
    hand-written strategy, then its -jit form with `auto` and with `explicit`."""
    if p.jit_model is None:
        return
    for accum in p.jit_accums:
        for hand, jit in p.jit_pairs:
            for name, axis in ((hand, "auto"), (jit, "auto"), (jit, "explicit")):
                yield f"{hand} / {jit}", p.jit_model.replace(strategy=name, axis_type=axis, devices=max(p.time_ns),
                                                             accum=accum, steps=p.steps)


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
    return base.replace(model="gpt", data="text", strategy=ONE_DEVICE, devices=1, dtype="bfloat16", n_layer=12,
                        n_head=12, d_model=768, seq_len=1024, batch_size=16, platform="gpu")
