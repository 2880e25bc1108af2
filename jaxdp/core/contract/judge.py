"""Where a step's collectives (`report.Comm`) part from what the user meant (`intent.Intent`): one `Finding`
per departure, each in the user's terms with its fix.

Only bulk collectives are judged: those of at least P / 500 elements (P: the parameters' elements), so a loss's
or a gradient norm's scalar all-reduce is listed but never read as the gradient sync. Sizes are in units of
P per step: a reduction's elements (a reduce-scatter's whole input) x its count is the gradient it syncs, an
all-gather's output x its count the parameters it gathers. The thresholds sit halfway between the textbook
counts (0 and 1, 1 and k), so a tensor more or less (padding, a tied weight, a BatchNorm's statistics) never
tips a verdict."""
from __future__ import annotations

from ..registry import strategies as registry
from .intent import GRID, SHARDS_GRADS, SHARDS_PARAMS, SHARDS_STATE, Intent
from .report import Comm, Finding

KINDS = ("no-gradient-sync", "wrong-axis", "sync-per-microbatch", "extra-gradient-sync", "reduce-dtype",
         "unexpected-gather", "state-replicated", "params-replicated", "gathered-too-often", "all-reduce-not-scatter",
         "no-replica-sync", "no-overlap", "master-dtype", "sync-every-step")
DTYPE_NAMES = {"f32": "float32", "bf16": "bfloat16", "f16": "float16", "f64": "float64", "bf16>f32": "bfloat16",
               "float": "float32", "c10::BFloat16": "bfloat16", "c10::Half": "float16", "double": "float64"}
REDUCTIONS = ("all-reduce", "reduce-scatter", "reduce")
FLOATS = {"float32", "bfloat16", "float16", "float64"}


def dtypes(c: Comm) -> set[str]:
    """The dtypes `c` reduces in, by name ("bf16>f32", bf16 that XLA:CPU widened, is bfloat16)."""
    return {DTYPE_NAMES.get(d, d) for d in c.dtype.split("+")}


def sent(c: Comm) -> float:
    """Bytes one device sends per step for `c` by the ring algorithms (all-reduce 2 (g-1)/g B, reduce-scatter
    and all-gather (g-1)/g B of the whole, a permute its message)."""
    g, times = max(c.group, 1), c.count or 1
    factor = {"all-reduce": 2 * (g - 1) / g, "reduce-scatter": (g - 1) / g, "all-gather": (g - 1) / g}
    return factor.get(c.ran_as or c.op, 1.0) * c.bytes * times


def _per_step(comms, p: int) -> float:
    return sum(c.elements * (c.count or 1) for c in comms) / max(p, 1)


def findings(comms: list[Comm], intent: Intent, devices: int, p: int, state_sharded: bool | None = None,
             params_sharded: bool | None = None) -> list[Finding]:
    """Every departure of `comms` (one step on `devices` data-parallel devices, `p` parameter elements) from
    `intent`; `state_sharded`, `params_sharded`: whether the optimizer state and the parameters are stored
    sharded between steps (None: not known here, then read from the gathers)."""
    if devices <= 1:
        return []
    bulk = [c for c in comms if c.elements >= max(2, p // 500) and dtypes(c) <= FLOATS]
    out = _dtype(bulk, intent)
    if intent.name in GRID:  # zero3 within each group, the shards all-reduced across the groups
        out += _hsdp(bulk, intent, devices, p)
    else:
        out += _sync(bulk, intent, devices, p)
    layout = _gathers(bulk, intent, p, state_sharded, params_sharded)
    if any(f.kind == "params-replicated" for f in layout):  # replicated parameters: their all-reduce follows
        out = [f for f in out if f.kind != "all-reduce-not-scatter"]
    out = layout + out + _outer(bulk, intent, devices, p)
    if _all_reduced(intent):
        out += _overlap(bulk)
    return out


def _all_reduced(intent: Intent) -> bool:
    """ddp's intent: replicated parameters, one all-reduce of the gradients every step (its row's `comm`)."""
    return registry.get(intent.name, "comm") == "all-reduce"


def _outer(bulk, intent: Intent, devices: int, p: int) -> list[Finding]:
    """An intent of K > 1 `inner_steps` (diloco): the parameters' all-reduce only in the outer step, a
    conditional's branch taken once every K steps; one outside any branch runs on every step."""
    every = [c for c in bulk if c.op in REDUCTIONS and c.group >= devices and not c.branch]
    if intent.inner_steps <= 1 or _per_step(every, p) < 0.5:
        return []
    return [Finding("sync-every-step", f"{_per_step(every, p):.3g} x P elements are all-reduced on every step, "
                    f"where {intent.name} all-reduces them once every {intent.inner_steps} steps (the outer step): "
                    f"{intent.inner_steps}x the traffic, and the replicas never take their local steps apart",
                    "all-reduce inside the outer step's branch only (jax.lax.cond(step % K == K - 1, outer, "
                    "inner, ...); torch: all_reduce under `if step % K == K - 1`)")]


def _dtype(bulk, intent: Intent) -> list[Finding]:
    off = [c for c in bulk if c.op in REDUCTIONS and dtypes(c) - {intent.reduce_dtype}]
    if not off:
        return []
    got = "+".join(sorted(set().union(*(dtypes(c) for c in off)) - {intent.reduce_dtype}))
    widened = " (XLA:CPU widened it to f32 to run it, then narrowed the result back)" if any(
        "bf16>f32" in c.dtype for c in off) else ""
    return [Finding("reduce-dtype", f"{len(off)} gradient reduction(s) run in {got}, not {intent.reduce_dtype}"
                    f"{widened}: the sum is rounded to {got} before the optimizer sees it",
                    f"cast the gradients to {intent.reduce_dtype} before they are reduced (JAX: differentiate the "
                    f"{intent.reduce_dtype} master, cast inside the loss; torch FSDP2: "
                    f"MixedPrecisionPolicy(reduce_dtype=torch.{intent.reduce_dtype}))")]


def _sync(bulk, intent: Intent, devices: int, p: int) -> list[Finding]:
    """The gradient sync of ddp and zero1-3: once per step, over every data-parallel device."""
    reductions = [c for c in bulk if c.op in REDUCTIONS]
    whole = [c for c in reductions if c.group >= devices]
    part = [c for c in reductions if c.group < devices]
    synced, ring = _per_step(whole, p), _per_step([c for c in bulk if c.op == "collective-permute"], p)
    if synced < 0.5 and _per_step(part, p) >= 0.5:
        c = max(part, key=lambda c: c.elements)
        return [Finding("wrong-axis", f"the gradients are reduced over {c.axis} only ({c.group} of {devices} "
                        f"devices): the other devices' gradients never meet theirs, so {devices // c.group} groups "
                        f"train apart or repeat the same rows", "shard the batch over every data-parallel mesh axis "
                        "(NamedSharding(mesh, P(('replica', 'data')))) or reduce over all of them (psum over both "
                        "axes; torch: the world's process group)")]
    exchanged = ring + _per_step([c for c in bulk if c.op in ("all-to-all", "all-gather")], p)
    if synced < 0.5 and exchanged < 0.5:
        return [Finding("no-gradient-sync", f"no collective reduces the gradients across the {devices} devices: "
                        "each device steps on its own rows' gradient and the replicas drift apart",
                        "average the gradients over the data axis (jax.lax.pmean(grads, 'data') inside shard_map, "
                        "or shard the batch with NamedSharding(mesh, P('data')) under jit; torch: wrap the model "
                        "in DistributedDataParallel or fully_shard)")]
    out, k = [], intent.accumulation
    if synced >= 1.5 and k > 1 and synced >= 0.75 * k:
        out.append(Finding("sync-per-microbatch", f"the gradients are reduced {synced:.3g} times per step, once "
                           f"per micro-batch of {k}: {synced:.3g}x the traffic of one sync per step",
                           "accumulate the micro-batches' gradients locally and reduce once after the last (torch "
                           "DDP: model.no_sync() for all but the last; FSDP2: model.set_requires_gradient_sync("
                           "False) until the last; JAX: sum local gradients in the scan, reduce after it)"))
    elif synced >= 1.5:
        out.append(Finding("extra-gradient-sync", f"the gradients are reduced {synced:.3g} times per step, not once",
                           "reduce each gradient once per step (a second pmean/psum, or an all_reduce on top of "
                           "DDP's own, sums twice)"))
    if intent.name in SHARDS_GRADS and _per_step([c for c in whole if c.op == "all-reduce"], p) >= 0.5:
        out.append(Finding("all-reduce-not-scatter", f"the gradients are all-reduced whole, where {intent.name} "
                           "reduce-scatters them: every device receives and holds the full gradient (ZeRO-1's "
                           "memory and 2x a reduce-scatter's traffic)", "shard the gradients like the optimizer "
                           "state (jax.lax.psum_scatter, or a sharding constraint P('data') on the gradients) so "
                           "each device gets only its shard"))
    return out


def _hsdp(bulk, intent: Intent, devices: int, p: int) -> list[Finding]:
    """hsdp: reduce-scatter and gathers within a shard group of S < D devices, the shards all-reduced across
    the R = D / S replica groups."""
    whole = [c for c in bulk if c.op in REDUCTIONS and c.group >= devices]
    if _per_step(whole, p) >= 0.5:
        ops = " and ".join(sorted({c.op for c in whole}))
        return [Finding("wrong-axis", f"the gradients are reduced over all {devices} devices at once ({ops}), not "
                        "within shard groups and then across replicas: the 2-D mesh became one flat group",
                        "shard parameters and gradients over the shard axis only (P('data') on a ('replica', "
                        "'data') mesh, the batch over both; torch: fully_shard(model, mesh=init_device_mesh(..., "
                        "(R, S))))")]
    inner = [c for c in bulk if c.op in ("reduce-scatter", "all-gather") and 1 < c.group < devices]
    if not inner:
        return [Finding("wrong-axis", f"every gather and reduction runs over all {devices} devices: this is zero3 "
                        "over the whole world, not hsdp's shard groups replicated across", "give the mesh two axes "
                        "(replica, shard) and shard over the inner one only (torch: fully_shard with a 2-D "
                        "DeviceMesh of (replicas, shard))")]
    s = max(c.group for c in inner)
    across = [c for c in bulk if c.op == "all-reduce" and c.group == devices // s]
    if _per_step(across, p) * s < 0.5:
        return [Finding("no-replica-sync", f"the gradient shards are never all-reduced across the {devices // s} "
                        "replica groups: each group trains on its own rows", "all-reduce each gradient shard over "
                        "the replica axis (jax.lax.pmean(g, 'replica'); torch: a 2-D mesh for fully_shard)")]
    return []


def _gathers(bulk, intent: Intent, p: int, state_sharded: bool | None, params_sharded: bool | None) -> list:
    """Where the parameters and the optimizer state live, from their shardings (or, unknown, from the gathers)."""
    gathered, k = _per_step([c for c in bulk if c.op == "all-gather"], p), intent.accumulation
    if _all_reduced(intent) and (params_sharded or (params_sharded is None and gathered >= 0.5)):
        return [Finding("unexpected-gather", f"the parameters are stored sharded and all-gathered ({gathered:.3g} "
                        "x P per step): this is FSDP/ZeRO-3, where ddp keeps a full replica on every device",
                        "place the parameters replicated (NamedSharding(mesh, P())), or check against "
                        "--intent zero3 if sharding was meant")]
    if intent.name in SHARDS_PARAMS:
        if params_sharded is False or (params_sharded is None and gathered < 0.5):
            return [Finding("params-replicated", "the parameters are not sharded: every device holds all of them "
                            f"between steps, so {intent.name} saves no parameter memory", "shard the parameters "
                            "over the data axis (NamedSharding(mesh, P('data')) on a dimension that divides; torch: "
                            "fully_shard each layer, then the root)")]
        if gathered > 2 * k + 0.5:
            return [Finding("gathered-too-often", f"the parameters are all-gathered {gathered:.3g} times per step, "
                            f"more than forward and backward of {k} micro-batch(es) need ({2 * k})",
                            "gather each unit once for forward (and once for backward when resharding): no "
                            "second jax.checkpoint around a gathered unit, no gather outside the unit")]
        return []
    if intent.name in SHARDS_STATE and (state_sharded is False or (state_sharded is None and gathered < 0.5)):
        return [Finding("state-replicated", "the optimizer state is replicated: every device updates every "
                        "parameter and holds all of the optimizer's state (no ZeRO saving)",
                        "shard the optimizer state over the data axis (NamedSharding(mesh, P('data')) on it; "
                        "torch: ZeroRedundancyOptimizer(params, optimizer_class=...) or fully_shard)")]
    if intent.name in SHARDS_STATE and gathered > 1.5:
        return [Finding("gathered-too-often", f"the parameters are all-gathered {gathered:.3g} times per step, "
                        f"where {intent.name} gathers them once, after the update", "keep the parameters "
                        "replicated between steps; gather the updated shards once")]
    return []


def _overlap(bulk) -> list[Finding]:
    """ddp's buckets (all-reduces) overlap backward: several gradient all-reduces, none with compute running
    beside it. A reduce to one root (the project's `dp`, a tree) is not DDP's and is not judged here."""
    reductions = [c for c in bulk if c.op == "all-reduce"]
    if len(reductions) < 2 or any(c.overlaps is None or c.overlaps for c in reductions):
        return []
    return [Finding("no-overlap", f"none of the {len(reductions)} gradient all-reduces runs while backward "
                    "computes: each starts after the last gradient is ready, so communication adds to the step",
                    "let DDP's reducer launch each bucket from its gradient hooks (no manual all_reduce after "
                    "loss.backward(); bucket_cap_mb below the model's gradient bytes)")]
