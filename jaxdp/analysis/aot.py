"""A strategy's training step compiled for GPUs this machine does not have (`--target`, docs/GPU.md).

JAX's CUDA plugin compiles without a driver (`JAX_SKIP_CUDA_CONSTRAINTS_CHECK=1`): a topology of
`--devices` GPUs of the target on `--nodes` hosts (`jax.experimental.topologies`, from the target's XLA
configuration in jaxdp/assets/gpu/), a mesh over its devices, and the step lowered from shapes alone. No
parameter is allocated anywhere: the model's parameters come from `nnx.eval_shape` of its init, the
optimizer state from `jax.eval_shape` of the optimizer's, and each is a `ShapeDtypeStruct` with the
`NamedSharding` the strategy's `init` gives it (`abstract_state`, from its layout row), so GPT-2 124M and
Llama 3 8B compile on a CPU machine. XLA:GPU's own passes run (its combiners, its latency-hiding scheduler,
its buffer assignment): the program, the schedule and `memory_analysis()` are the GPU's; no kernel runs.
`--kernels fused` compiles cuDNN's fused attention (`attention_for`, `cudnn_built_version`; docs/KERNELS.md).
"""
from __future__ import annotations

import contextlib
import math
import os
import time
import warnings

from ..core.registry import strategies as registry
from ..core.run import data, targets
from ..core.run.config import JIT_STRATEGIES
from ..strategies.zero import layout as zero_layout
from . import schedule

CACHE_READ = "Error reading persistent compilation cache entry"  # JAX's warning, for a target program
# a full copy on every device (single: its one): the hand-written rows that shard nothing, not per-device stacks
REPLICATED = tuple(e.name for e in registry.ENTRIES if e.jax and not any(e.shards) and e.comm != "jit"
                   and not e.per_device)


def one_device(name: str, opts) -> bool:
    """Does `name`'s step take its state and batch on one device, unsharded (single's plain `jit`, as its
    `init` and `put_batch` place them)? A NamedSharding over the one-device mesh instead types the batch
    `@data` under an explicit mesh, and an embedding's gather then refuses to trace (ShardingTypeError).
    Canonical single is ddp's program on a one-device mesh: it takes ddp's shardings."""
    return registry.on_one_device(name) and opts.reduction != "canonical"


def attention_for(cfg) -> tuple[str, str]:
    """(the attention a --target step compiles, the note saying why where --kernels fused gets XLA's): "mirrored"
    (the twins' einsums), "cudnn" (cuDNN's fused attention: custom calls) or "xla" (jax.nn's XLA attention)."""
    if cfg.kernels != "fused" or cfg.model not in ("gpt", "gpt2", "llama"):
        return "mirrored", ""
    if cfg.dtype != "bfloat16":
        return "xla", (f"--kernels fused --dtype {cfg.dtype}: cuDNN's fused attention computes in bf16/fp16 only, so "
                       f"this program has XLA's attention (jax.nn.dot_product_attention, implementation='xla')")
    return "cudnn", ""


@contextlib.contextmanager
def cudnn_built_version():
    """Let JAX trace cuDNN attention where no cuDNN is loaded (the gpu-aot extra installs none). JAX asks the
    loaded cuDNN its version while tracing (`fused_attention_stablehlo.check_cudnn_version`, which raises
    "cuDNN not found." without one) and uses it only to refuse features older versions lack (compute capability
    10.3 before 9.11, multi-head latent attention before 9.10). Here the probe answers the version the CUDA
    plugin was built against (`cudnn_build_version()`, 90800 for jax-cuda12-plugin 0.10.2): the least cuDNN its
    `with-cuda` install accepts (>=9.8, <10). Restored on exit; where cuDNN answers (a GPU machine), nothing is
    changed."""
    from jax._src.cudnn import fused_attention_stablehlo as fmha
    from jax._src.lib import cuda_versions

    probe = getattr(fmha, "check_cudnn_version", None)  # JAX 0.10's name (a later JAX may probe elsewhere)
    try:
        if probe is not None:
            probe()
        loaded = True
    except RuntimeError:
        loaded = cuda_versions is None  # no plugin: nothing to answer with (--target needs it: require_extra)
    if loaded:
        yield
        return
    fmha.check_cudnn_version = cuda_versions.cudnn_build_version
    try:
        yield
    finally:
        fmha.check_cudnn_version = probe


def check(cfg) -> None:
    """What a --target run cannot compile, in one line naming the fix (`targets.check_run`)."""
    targets.check_run([cfg.strategy], cfg.model)


def topology_mesh(target: str, devices: int, nodes: int):
    """A one-axis `data` mesh over `devices` GPUs of `target` on `nodes` hosts (device k on host k // (N/K))."""
    os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")  # no driver to check the CUDA libraries against
    from jax.experimental import topologies

    from .. import devices as devices_mod

    topo = topologies.get_topology_desc(f"{target}x{devices}", "cuda", target_config=targets.config_text(target),
                                        topology=f"1x{nodes}x{devices // nodes}")
    found = sorted(topo.devices, key=lambda d: d.id)
    return devices_mod.mesh(found)


def abstract_problem(cfg):
    """(problem, optimizer, options) of `cfg` as `jaxdp.train.prepare` builds them, the parameters as shapes."""
    from flax import nnx

    from .. import models, strategies, train

    dataset = data.load(cfg.data, cfg.seed, cfg.seq_len)
    model = nnx.eval_shape(lambda: models.build(cfg, dataset))
    problem = models.problem_of(model, cfg)
    optimizer, options = train.strategy_options(cfg)
    return dataset, problem, optimizer, strategies.options(cfg.strategy, cfg.accum, **options)


def _sds(leaf, sharding):
    import jax

    return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding)


def abstract_state(name: str, problem, optimizer, mesh, opts):
    """The train state `init` would place, as ShapeDtypeStructs with its shardings (no array made), and the
    mesh the step runs on (hsdp's grid, the -jit strategies' typed mesh)."""
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from .. import canonical
    from ..devices import AXIS, grid
    from ..strategies import TrainState
    from ..strategies.jit import layout as jit_layout

    rep = NamedSharding(mesh, P())
    if one_device(name, opts):  # single's plain jit: its state on its one device, as its `init` places it
        rep = jax.sharding.SingleDeviceSharding(mesh.devices.flat[0])
    if name in REPLICATED:
        params = jax.tree.map(lambda p: _sds(p, rep), problem.params)
        opt = jax.eval_shape(optimizer.init, params)
        return TrainState(params, jax.tree.map(lambda a: _sds(a, rep), opt)), mesh
    if name in JIT_STRATEGIES:
        row, mesh = jit_layout.LAYOUTS[name], jit_layout.typed_mesh(mesh, opts.axis_type)
        opt = jax.eval_shape(optimizer.init, problem.params)
        place = {True: lambda tree: jit_layout.shardings(mesh, jit_layout.specs(tree, mesh.size, True)),
                 False: lambda tree: jit_layout.shardings(mesh, jit_layout.specs(tree, mesh.size, False))}
        return TrainState(jax.tree.map(_sds, problem.params, place[row.shards_params](problem.params)),
                          jax.tree.map(_sds, opt, place[row.shards_opt_state](opt))), mesh
    layout = zero_layout.of(name)
    if registry.entry(name).grid:  # hsdp: the replica x shard grid of --replicas groups
        mesh = grid(mesh, opts.replicas, opts.hsdp_hosts)
        rep = NamedSharding(mesh, P())
    multiple = canonical.BLOCKS if opts.reduction == "canonical" else mesh.shape[AXIS]
    sharded = NamedSharding(mesh, P(AXIS))

    def flat(p):
        padded = math.ceil(math.prod(p.shape) / multiple) * multiple
        return jax.ShapeDtypeStruct((padded,), p.dtype, sharding=sharded) if p.shape else _sds(p, rep)

    flats = jax.tree.map(flat, problem.params)
    opt = jax.tree.map(lambda a: _sds(a, sharded if a.shape else rep), jax.eval_shape(optimizer.init, flats))
    params = flats if layout.shards_params else jax.tree.map(lambda p: _sds(p, rep), problem.params)
    return TrainState(params, opt), mesh


def abstract_batch(cfg, dataset, name: str, mesh, opts):
    """Step 1's (x, y) as the strategy's `put_batch` places them, as ShapeDtypeStructs (the global batch of
    token ids or features is read for its shape only: a few KiB)."""
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from .. import train
    from ..devices import AXIS, batch_sharded

    x, y = train.host_batch(cfg, dataset, 1)
    if name in JIT_STRATEGIES:  # jit/step.put_batch: (accum, N, rows per device, ...) split on axis 1
        n, sharding = mesh.size, NamedSharding(mesh, P(None, AXIS))
        return tuple(jax.ShapeDtypeStruct((cfg.accum, n, a.shape[0] // (cfg.accum * n), *a.shape[1:]), a.dtype,
                                          sharding=sharding) for a in (x, y))
    on = jax.sharding.SingleDeviceSharding(mesh.devices.flat[0]) if one_device(name, opts) else batch_sharded(mesh)
    return tuple(jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=on) for a in (x, y))


class TargetStep:
    """`cfg`'s step compiled for its target: `program` (jax.stages.Compiled), `lowered`, the `problem` (shapes)
    and `optimizer`, the lowering and compile times, the `attention` compiled (`attention_for`) with its
    `attention_note` ("" or why --kernels fused has no cuDNN attention) and `fused_calls` (`schedule.fmha_calls`)."""
    stats_program = None  # no running statistics (`check`): the train step is the only program

    def __init__(self, cfg, target: str, nodes: int):
        import jax

        from .. import strategies

        check(cfg)
        dataset, self.problem, self.optimizer, opts = abstract_problem(cfg)
        mesh = topology_mesh(target, cfg.devices, nodes)
        strat = strategies.make(cfg.strategy, self.problem, self.optimizer, mesh, opts, return_grads=False)
        state, mesh = abstract_state(cfg.strategy, self.problem, self.optimizer, mesh, opts)
        batch = abstract_batch(cfg, dataset, cfg.strategy, mesh, opts)
        before = jax.config.values["jax_disable_most_optimizations"]  # the suite sets it for XLA:CPU
        jax.config.update("jax_disable_most_optimizations", False)
        try:
            t0 = time.perf_counter()
            self.attention, self.attention_note = attention_for(cfg)
            self.lowered = self._lower(strat, state, batch)
            t1 = time.perf_counter()
            with warnings.catch_warnings():  # with a persistent cache set, JAX reads a target program back through
                warnings.filterwarnings("ignore", message=CACHE_READ)  # a client it has not; it compiles anew
                self.program = self.lowered.compile()
        finally:
            jax.config.update("jax_disable_most_optimizations", before)
        self.lower_s, self.compile_s = t1 - t0, time.perf_counter() - t1
        self.fused_calls = schedule.fmha_calls(self.program.as_text() if self.attention == "cudnn" else "")
        if self.attention == "cudnn" and not sum(self.fused_calls.values()):  # the model traced no attention.fused
            self.attention_note = "--kernels fused: the compiled program holds no cuDNN attention call"
        self.cfg, self.target, self.nodes = cfg, targets.TARGETS[target], nodes
        self.state, self.batch, self.strategy = state, batch, strat  # read by the contract (contract/strategies.py)

    def _lower(self, strat, state, batch):
        """The step lowered with the attention `attention_for` chose; where cuDNN refuses this attention at trace
        time (NotImplementedError: a head dim, a dtype), XLA's, with the refusal in `attention_note`."""
        from ..models import attention

        if self.attention != "cudnn":
            with attention.implementation("xla" if self.attention == "xla" else None):
                return strat.compiled_step.lower(state, *batch)
        try:
            with attention.implementation("cudnn"), cudnn_built_version():
                return strat.compiled_step.lower(state, *batch)
        except NotImplementedError as refused:
            self.attention, self.attention_note = "xla", (f"--kernels fused: cuDNN's fused attention refused this "
                                                          f"model ({refused}), so this program has XLA's attention")
        with attention.implementation("xla"):
            return strat.compiled_step.lower(state, *batch)
