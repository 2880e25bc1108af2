"""The strategies, one declared row each: every list of strategies in jaxdp and torch_ref reads this table.

A row (`Entry`, frozen) says all the project knows about one strategy, in plain values; nothing here imports
a framework (a factory is a "module:attribute" path, imported on first use by `load`), so both wings and the
core read it without importing each other. Its fields:

- `name`: the `--strategy` value, the same algorithm in both frameworks; `summary`: what it is, in one line.
- `jax`, `torch`: the factory's import path in each framework ("" where that framework has no such
  strategy). `twin`: where `torch` is "", the strategy torch_ref runs under this name (a -jit name's
  same-layout twin), and `twin_tool` what that twin is in torch's words.
- `shards`: (parameters, gradients, optimizer state), True where each device holds a shard (1/N; a `grid`
  strategy's 1/S); `layout`: the name of its row in `strategies/zero/layout.py` (both wings) or in
  `strategies/jit/layout.py` ("" for a full copy everywhere).
- `jax_options`, `torch_options`: the options its factory reads besides `accum` and the reduction's, as
  `parallelize(..., **options)` and the RunConfig fields name them (the flags `readers.py` holds against it).
- `accumulates`: it takes `--accum K` (one sync per step); `reductions`: the `--reduction` values it runs;
  `batchnorm`: jaxdp runs models with running statistics (BatchNorm, `--model cnn`) under it;
  `fully_shard`: torch_ref builds it on FSDP2's `fully_shard` (bf16 through its MixedPrecisionPolicy).
- `grid`: its devices form an R x S grid of `--replicas` R groups (the shard count is N / R; the run's meta
  records the grid as `hsdp_grid`; `--hsdp-hosts` says which groups a host holds); False: one 1-D mesh.
- `one_device`: it runs on one device, not over a mesh; `per_device`: jaxdp's train state holds one copy per
  device, stacked on a leading axis (jax.pmap), which a checkpoint and the statistics' program unstack.
- `intent`: the data-parallel layout it stands for in the contract (`core/contract/intent.py`);
  `comm`: its family in the communication theory (`analysis/theory.py` of both wings): "none" (no
  collective), "all-reduce", "ring" (point-to-point), "tree" (dp's reduce and broadcast), "zero" (its
  ZeRO row), "jit" (its -jit row), "outer" (the parameters all-reduced once every `--inner-steps` K steps,
  averaged per step: 1/K of an all-reduce).
- `oracle`: the strategy whose run it must equal, step for step ("single" for data parallelism; a
  strategy that is not meant to equal one device names its own reference).
- `parity`: in the cross-framework parity pairs (`judge/parity.py`); `overhead_goal`: the bench's goal
  for its step time over single's (None: no goal); `bench`: the bench items that time it besides the plan's
  own lists (`harness/bench/`): "nan-check" (item 11), "nan-check-quick" (item 11 under --quick), "gpu" (the
  GPU target's rows, `gpu_target.py`); `tags`: further facts other lists read: "ddp-buffers" (torch_ref wraps
  it in DistributedDataParallel, whose broadcast_buffers sends the BatchNorm buffers every step: torch's theory),
  "default" (the strategy a command or library call runs when none is given: `--strategy`, `--intent`),
  "check-vma" (jaxdp's shard_map checks replication, so each BatchNorm statistic's use is one more psum in
  backward: jaxdp's theory).

A new strategy is its factory in each framework and one row here, appended (the CLI lists the rows in the
table's order); the lists above follow. A field with no value among those (a new `comm` family, a new
`oracle`) is where the theory or the judge needs its new branch.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass

from ..errors import ConfigError

COMMS = ("none", "all-reduce", "ring", "tree", "zero", "jit", "outer")


@dataclass(frozen=True)
class Entry:
    name: str
    summary: str
    jax: str = ""
    torch: str = ""
    twin: str = ""
    twin_tool: str = ""
    shards: tuple = (False, False, False)
    layout: str = ""
    jax_options: tuple = ()
    torch_options: tuple = ()
    accumulates: bool = True
    reductions: tuple = ("native", "canonical")
    batchnorm: bool = True
    fully_shard: bool = False
    grid: bool = False
    one_device: bool = False
    per_device: bool = False
    intent: str = "ddp"
    comm: str = "all-reduce"
    oracle: str = "single"
    parity: bool = True
    overhead_goal: float | None = None
    bench: tuple = ()
    tags: tuple = ()

    def __post_init__(self):
        assert self.comm in COMMS, (self.name, self.comm)
        assert not (self.torch and self.twin), self.name

    def in_framework(self, framework: str) -> bool:
        """Whether `--strategy name` runs in `framework` ('jax' or 'torch'; torch runs a twin for a -jit name)."""
        return bool(self.jax) if framework == "jax" else bool(self.torch or self.twin)

    def options(self, framework: str) -> tuple:
        return self.jax_options if framework == "jax" else self.torch_options


STAGE_OPTIONS = ("collectives",)
SHARD_OPTIONS = ("reshard_after_forward",)
GRID_OPTIONS = ("replicas", "hsdp_hosts")
DILOCO_OPTIONS = ("inner_steps", "outer_lr", "outer_momentum")
JIT = dict(reductions=("native",), batchnorm=False, comm="jit", jax_options=("axis_type",), parity=False)
GPU, NAN, NAN_QUICK = ("gpu",), ("nan-check",), ("nan-check", "nan-check-quick")

ENTRIES = (
    Entry("single", "one device, the oracle of every data-parallel strategy", "jaxdp.strategies.single:make",
          "torch_ref.strategies.single:make", one_device=True, comm="none", oracle="single", bench=NAN_QUICK),
    Entry("dp", "a parameter server: gradients reduced to device 0, parameters broadcast back",
          "jaxdp.strategies.dp:make", "torch_ref.strategies.dp:make", comm="tree", bench=GPU),
    Entry("ddp", "replicated parameters, one all-reduce of the gradients per step", "jaxdp.strategies.ddp:make",
          "torch_ref.strategies.ddp:make", torch_options=("bucket_mb",), overhead_goal=1.15, bench=GPU + NAN_QUICK,
          tags=("ddp-buffers", "default", "check-vma")),
    Entry("ddp-pmap", "ddp written with jax.pmap (per-device stacks)", "jaxdp.strategies.ddp_pmap:make",
          per_device=True, parity=False),
    Entry("ddp-naive", "Picotron's naive ddp: one hook per parameter all-reduces its gradient, then divides by N",
          torch="torch_ref.strategies.naive:make", parity=False),
    Entry("ddp-bucket", "ddp with the gradients packed into buckets of --bucket-mb, all-reduced in backward order",
          "jaxdp.strategies.bucket:make", "torch_ref.strategies.bucket:make", jax_options=("bucket_mb",),
          torch_options=("bucket_mb",), bench=GPU + NAN, tags=("check-vma",)),
    Entry("ddp-ring", "ddp over an explicit ring all-reduce (reduce-scatter then all-gather, point to point)",
          "jaxdp.strategies.ring:make", "torch_ref.strategies.ring:make", comm="ring", bench=GPU),
    Entry("zero1", "ZeRO stage 1: the optimizer state sharded", "jaxdp.strategies.zero:make_zero1",
          "torch_ref.strategies.zero.zero1:make", shards=(False, False, True), layout="ZERO1",
          jax_options=STAGE_OPTIONS, torch_options=("bucket_mb",), intent="zero1", comm="zero", overhead_goal=1.15,
          bench=GPU + NAN, tags=("ddp-buffers",)),
    Entry("zero2", "ZeRO stage 2: gradients and optimizer state sharded", "jaxdp.strategies.zero:make_zero2",
          "torch_ref.strategies.zero.zero2:make", shards=(False, True, True), layout="ZERO2",
          jax_options=STAGE_OPTIONS, intent="zero2", comm="zero", overhead_goal=1.15, bench=GPU + NAN_QUICK),
    Entry("zero3", "ZeRO stage 3 (FSDP, alias fsdp): parameters, gradients and optimizer state sharded",
          "jaxdp.strategies.zero:make_zero3", "torch_ref.strategies.zero.zero3:make", shards=(True, True, True),
          layout="ZERO3", jax_options=STAGE_OPTIONS + SHARD_OPTIONS, torch_options=SHARD_OPTIONS + ("units",),
          fully_shard=True, intent="zero3", comm="zero", bench=GPU + NAN),
    Entry("hsdp", "zero3 within each of --replicas groups of N / R devices, replicated across the groups",
          "jaxdp.strategies.hsdp:make", "torch_ref.strategies.hsdp:make", shards=(True, True, True), layout="HSDP",
          jax_options=STAGE_OPTIONS + SHARD_OPTIONS + GRID_OPTIONS,
          torch_options=SHARD_OPTIONS + ("units",) + GRID_OPTIONS, batchnorm=False, fully_shard=True, grid=True,
          intent="hsdp", comm="zero", parity=False, bench=GPU + NAN),
    Entry("diloco", "local SGD (DiLoCo): K steps per replica with no communication, then an outer Nesterov step on "
          "the replicas' mean", "jaxdp.strategies.diloco:make", "torch_ref.strategies.diloco:make",
          jax_options=DILOCO_OPTIONS, torch_options=DILOCO_OPTIONS, reductions=("native",), batchnorm=False,
          intent="diloco", comm="outer", oracle="jaxdp.strategies.diloco_reference:simulate", parity=False),
    Entry("ddp-jit", "ddp as plain jax.jit over NamedShardings (the partitioner inserts the collectives)",
          "jaxdp.strategies.jit.ddp:make", twin="ddp", twin_tool="DistributedDataParallel", layout="DDP",
          bench=GPU + NAN, **JIT),
    Entry("zero1-jit", "zero1 as plain jax.jit over NamedShardings", "jaxdp.strategies.jit.zero1:make",
          twin="zero1", twin_tool="ZeroRedundancyOptimizer over DDP", shards=(False, False, True), layout="ZERO1",
          intent="zero1", bench=GPU, **JIT),
    Entry("fsdp-jit", "zero3 as plain jax.jit over NamedShardings", "jaxdp.strategies.jit.fsdp:make", twin="zero3",
          twin_tool="FSDP2 fully_shard", shards=(True, True, True), layout="FSDP", intent="zero3", bench=GPU + NAN,
          **JIT),
)
BY_NAME = {e.name: e for e in ENTRIES}
ALIASES = {"fsdp": "zero3"}
ONE_DEVICE = next(e.name for e in ENTRIES if e.one_device)  # the one-device run: the other runs' reference
# the ZeRO stage that shards parameters, gradients and optimizer state over one 1-D mesh: the sizes' suggestion
# the replicated layout: its own intent, no shards, one all-reduce of the gradients (ddp)
REPLICATED = next(e.name for e in ENTRIES if e.intent == e.name and not any(e.shards) and e.comm == "all-reduce")
DEFAULT = next(e.name for e in ENTRIES if "default" in e.tags)  # run when none is named
FULLY_SHARDED = next(e.name for e in ENTRIES if all(e.shards) and e.comm == "zero" and not e.grid)


def names(framework: str | None = None, **where) -> tuple[str, ...]:
    """The strategies' names in the table's order: of `framework` (None: all), with every `field=value` of
    `where` (`names("jax", grid=True)`)."""
    return tuple(e.name for e in ENTRIES if (framework is None or e.in_framework(framework))
                 and all(getattr(e, k) == v for k, v in where.items()))


def tagged(tag: str) -> tuple[str, ...]:
    """The strategies whose row's `tags` hold `tag`, in the table's order."""
    return tuple(e.name for e in ENTRIES if tag in e.tags)


def benched(item: str) -> tuple[str, ...]:
    """The strategies bench item `item` times (their rows' `bench`), in the table's order."""
    return tuple(e.name for e in ENTRIES if item in e.bench)


def entry(name: str) -> Entry:
    """The row of strategy `name` (an alias resolved); an unknown name is one line listing the known."""
    name = ALIASES.get(name, name)
    if name not in BY_NAME:
        raise ConfigError(f"--strategy {name!r} is not a strategy; valid: {', '.join(BY_NAME)}, "
                          f"{', '.join(f'{a} (= {b})' for a, b in ALIASES.items())}")
    return BY_NAME[name]


def get(name: str, field: str, default=None):
    """`field` of strategy `name`'s row, or `default` for a name the table does not hold (a user's own)."""
    row = BY_NAME.get(ALIASES.get(name, name))
    return default if row is None else getattr(row, field)


def on_one_device(name: str) -> bool:
    """Whether strategy `name` runs on one device (its row's `one_device`; False for a name the table lacks)."""
    return bool(get(name, "one_device", False))


def load(path: str):
    """The object at "module:attribute", imported now (the table itself imports no framework)."""
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)


def factories(framework: str) -> dict:
    """{name: factory} of `framework`'s own strategies (not the twins), imported."""
    key = "jax" if framework == "jax" else "torch"
    return {e.name: load(getattr(e, key)) for e in ENTRIES if getattr(e, key)}


def readers(framework: str, option: str) -> tuple[str, ...]:
    """The strategies of `framework` whose factory reads `option`."""
    return tuple(e.name for e in ENTRIES if option in e.options(framework))
