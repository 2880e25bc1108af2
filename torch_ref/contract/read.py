"""The collectives one step hands the process group, as `Comm`s, recorded by a TorchDispatchMode: every c10d
op this rank dispatches (DDP's reducer, FSDP2's gathers and reduce-scatters, ZeroRedundancyOptimizer's
broadcasts, a user's own `dist.all_reduce`) with its tensors' dtype and elements, and its process group's
ranks. gloo has no reduce-scatter: it runs one as an all-reduce of the whole input (`ran_as`).

Overlap: a gradient reduction overlaps backward when backward still computes after it is issued (aten compute
ops of the same autograd graph task dispatched after it, on this rank). One issued outside backward (a manual
all_reduce after `loss.backward()`) overlaps nothing. Other collectives' overlap is not read (None)."""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from jaxdp.core.contract.report import Comm

from .. import comm_groups

OPS = {"allreduce_": "all-reduce", "allreduce_coalesced_": "all-reduce", "_allgather_base_": "all-gather",
       "allgather_": "all-gather", "allgather_into_tensor_coalesced_": "all-gather",
       "_reduce_scatter_base_": "reduce-scatter", "reduce_scatter_": "reduce-scatter",
       "reduce_scatter_tensor_coalesced_": "reduce-scatter", "broadcast_": "broadcast", "reduce_": "reduce",
       "send": "collective-permute", "alltoall_": "all-to-all", "alltoall_base_": "all-to-all"}
WHOLE_IS_SECOND = ("reduce_scatter_", "reduce_scatter_tensor_coalesced_", "_reduce_scatter_base_")
COMPUTE = ("mm", "addmm", "bmm", "convolution", "convolution_backward", "native_layer_norm_backward",
           "embedding_dense_backward", "mul", "add", "sum", "threshold_backward", "gelu_backward",
           "_softmax_backward_data", "tanh_backward", "_scaled_dot_product_flash_attention_for_cpu_backward")


def _tensors(x) -> list:
    if torch.is_tensor(x):
        return [x]
    return [t for item in x for t in _tensors(item)] if isinstance(x, (list, tuple)) else []


class Recorder(TorchDispatchMode):
    """While active: `calls`, one dict per c10d op (op, dtype, elements, ranks, task, at), and `compute`, the
    aten compute ops per autograd graph task (for overlap)."""

    def __init__(self):
        super().__init__()
        self.calls, self.compute, self.seen = [], {}, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.__name__.split(".")[0]
        task = torch._C._current_graph_task_id()
        if func.namespace == "c10d" and name in OPS:
            whole = _tensors(args[1] if name in WHOLE_IS_SECOND else args[0])
            self.calls.append({"name": name, "op": OPS[name], "dtype": str(whole[0].dtype).removeprefix("torch.")
                               if whole else "?", "elements": sum(t.numel() for t in whole),
                               "itemsize": whole[0].element_size() if whole else 0,
                               "ranks": comm_groups._ranks(args), "task": task, "at": self.compute.get(task, 0)})
        elif task != -1 and name in COMPUTE:
            self.compute[task] = self.compute.get(task, 0) + 1
        return func(*args, **(kwargs or {}))


def _overlaps(call: dict, compute: dict) -> bool | None:
    if call["op"] not in ("all-reduce", "reduce-scatter", "reduce"):
        return None
    return call["task"] != -1 and compute.get(call["task"], 0) > call["at"]


def axis_name(ranks: list[int], world: int, mesh_dims: dict) -> str:
    """'world', a DeviceMesh dimension's name whose group is `ranks`, or 'ranks i,j'."""
    if len(ranks) == world:
        return "world"
    return mesh_dims.get(tuple(ranks), "ranks " + ",".join(map(str, ranks)))


def comms(rec: Recorder, mesh_dims: dict | None = None) -> list[Comm]:
    """The recorded calls as `Comm`s, identical ones (op, dtype, elements, group, overlap) merged into one
    with their count, in the order first issued."""
    world, merged = dist.get_world_size(), {}
    for call in rec.calls:
        ranks = sorted(call["ranks"])
        gloo = dist.get_backend() == "gloo"
        ran_as = "all-reduce" if gloo and call["op"] == "reduce-scatter" else ""
        key = (call["op"], call["dtype"], call["elements"], tuple(ranks), _overlaps(call, rec.compute), ran_as)
        if key in merged:
            merged[key]["count"] += 1
            continue
        merged[key] = {"op": call["op"], "dtype": call["dtype"], "elements": call["elements"],
                       "bytes": call["elements"] * call["itemsize"], "axis": axis_name(ranks, world, mesh_dims or {}),
                       "group": len(ranks), "count": 1, "overlaps": key[4], "ran_as": ran_as}
    return [Comm(**m) for m in merged.values()]
