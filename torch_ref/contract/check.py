"""`torch_ref.check(step, *args, model=..., intent=...)`: run one step of a user's own torch program on this
rank (an initialised process group; every rank calls it), record the collectives it hands the process group
(`read.Recorder`), and judge them against the intent (jaxdp/core/contract/judge.py).

    report = torch_ref.check(train_one_step, x, y, model=ddp_model, optimizer=opt, accumulation=2)
    report.ok, report.findings          # each finding: .kind, .message, .fix
    print(report); report.to_json()

`model` gives P (its parameters' elements, DTensors counted whole) and whether the parameters are sharded
(FSDP2's DTensors); `optimizer` whether its state is: the elements it updates on this rank (a
ZeroRedundancyOptimizer's partition, FSDP2's local shards, a flat shard) against P. After the step, the
parameters the optimizer updates (the model's, without one) and the optimizer's floating state (Adam's
moments; its step counts aside) must be held in `master_dtype` (jaxdp/core/contract/master.py)."""
from __future__ import annotations

import torch.distributed as dist

from jaxdp.core.contract import judge, master
from jaxdp.core.contract.intent import Intent
from jaxdp.core.contract.report import Report
from jaxdp.core.registry import strategies as registry

from . import read


def _local(p) -> int:
    return p.to_local().numel() if hasattr(p, "to_local") else p.numel()


def layout(model, optimizer) -> tuple[bool, bool | None, dict]:
    """(parameters sharded, optimizer state sharded or None without an optimizer, {ranks: mesh dim name})."""
    params = list(model.parameters())
    p = sum(x.numel() for x in params)
    meshes = {id(x.device_mesh): x.device_mesh for x in params if hasattr(x, "device_mesh")}
    dims = {}
    for mesh in meshes.values():
        for i, name in enumerate(mesh.mesh_dim_names or [f"dim{i}" for i in range(mesh.ndim)]):
            dims[tuple(sorted(dist.get_process_group_ranks(mesh.get_group(i))))] = name
    sharded = bool(meshes) and any(_local(x) < x.numel() for x in params)
    if optimizer is None:
        return sharded, None, dims
    inner = getattr(optimizer, "optim", optimizer)  # ZeroRedundancyOptimizer's local optimizer
    updated = sum(_local(x) for g in inner.param_groups for x in g["params"])
    return sharded, updated < 0.75 * p, dims


def held(model, optimizer) -> dict[str, set[str]]:
    """{"parameters": the floating dtypes of those the optimizer updates, "optimizer state": of its tensors
    that are no scalar} by name (`master.name`)."""
    inner = getattr(optimizer, "optim", optimizer)  # ZeroRedundancyOptimizer's local optimizer
    params = [x for g in inner.param_groups for x in g["params"]] if optimizer is not None else [
        x for x in model.parameters() if x.requires_grad]
    out = {"parameters": {master.name(x.dtype) for x in params if x.is_floating_point()}}
    if optimizer is not None:
        out["optimizer state"] = {master.name(t.dtype) for s in inner.state.values() for t in s.values()
                                  if hasattr(t, "is_floating_point") and t.is_floating_point() and t.dim() > 0}
    return {k: v for k, v in out.items() if v}


def check(step, *args, model, intent: str = registry.DEFAULT, accumulation: int = 1, reduce_dtype: str = "float32",
          optimizer=None, master_dtype: str = "float32", **kwargs) -> Report:
    """Run `step(*args, **kwargs)` once while recording; the report of what it sent (module docstring)."""
    want = Intent(intent, accumulation, reduce_dtype, master_dtype=master_dtype)
    rec = read.Recorder()
    with rec:
        step(*args, **kwargs)
    params_sharded, state_sharded, dims = layout(model, optimizer)
    comms = read.comms(rec, dims)
    devices, p = dist.get_world_size(), sum(x.numel() for x in model.parameters())
    facts = {"accumulation": accumulation, "reduce_dtype": reduce_dtype, "master_dtype": master_dtype,
             "devices": devices, "param_elements": p, "bytes_per_step": sum(judge.sent(c) for c in comms),
             "backend": dist.get_backend()}
    dtypes = held(model, optimizer)
    facts["held_dtypes"] = {k: sorted(v) for k, v in dtypes.items()}
    found = master.findings(dtypes, want) + judge.findings(comms, want, devices, p, state_sharded,
                                                                           params_sharded)
    return Report(want.name, comms, found, facts)
