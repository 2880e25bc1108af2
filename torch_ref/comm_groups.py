"""Which process group each collective ran on, for `torch_ref.analysis.accounting` (hsdp: a group of S ranks or
the R replicas of a shard, not the world).

torch.profiler's backend events (`gloo:all_gather`, run on the process group's worker threads) carry
the input's shape but not the group. `GroupSpy`, a TorchDispatchMode held around the profiled step,
sees every c10d op this rank calls (FSDP2's all-gathers, reduce-scatters and all-reduces, the loss's
all-reduce), with its ProcessGroup, and wraps it in a profiler range named `c10d group <ranks> <n>`
(n: the elements the backend event will record: the input shard of an all-gather, the whole input of a
reduce-scatter, which gloo runs as an all-reduce of it, the tensors of an all-reduce or broadcast); it
also wraps `funcol.all_reduce`, which DTensor calls inside another op's dispatch, where the mode is off.
`backend_groups` pairs each backend event with the earliest unpaired range of the same n that started
before it; an event with none (a collective the spy did not see) takes the group of the paired events
of its worker thread, or else the world.
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch.utils._python_dispatch import TorchDispatchMode

LABEL = "c10d group "
_INPUT_SECOND = ("_allgather_base_", "_reduce_scatter_base_", "allgather_", "allgather_into_tensor_coalesced_",
                 "reduce_scatter_", "reduce_scatter_tensor_coalesced_")


def _numel(x) -> int:
    if torch.is_tensor(x):
        return x.numel()
    return sum(_numel(t) for t in x) if isinstance(x, (list, tuple)) else 0


def _ranks(args) -> list[int]:
    boxed = [a for a in args if isinstance(a, torch.ScriptObject)]
    if not boxed:
        return list(range(dist.get_world_size()))
    return dist.get_process_group_ranks(dist.ProcessGroup.unbox(boxed[0]))


def _label(ranks, elements: int) -> str:
    return f"{LABEL}{','.join(map(str, ranks))} {elements}"


class GroupSpy(TorchDispatchMode):
    """Names every c10d op called under it after its process group's ranks (a profiler range), and every
    functional all-reduce (`funcol.all_reduce`: DTensor's reduction of a Partial, e.g. `clip_grad_norm_`'s
    norms, issued inside another op's dispatch, where the mode is off)."""

    def __enter__(self):
        self._all_reduce = funcol.all_reduce

        def all_reduce(tensor, reduceOp, group, tag=""):
            pg = dist.distributed_c10d._resolve_process_group(funcol._resolve_group_name(group, tag))
            with torch.profiler.record_function(_label(dist.get_process_group_ranks(pg), tensor.numel())):
                return self._all_reduce(tensor, reduceOp, group, tag)
        funcol.all_reduce = all_reduce
        return super().__enter__()

    def __exit__(self, *exc):
        funcol.all_reduce = self._all_reduce
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace != "c10d":
            return func(*args, **(kwargs or {}))
        op = func.__name__.split(".")[0]
        elements = _numel(args[1] if op in _INPUT_SECOND else args[0])
        with torch.profiler.record_function(_label(_ranks(args), elements)):
            return func(*args, **(kwargs or {}))


def backend_groups(events, world: int) -> dict[int, list[int]]:
    """{id(event): the ranks of its process group} for the profiler's backend events (`gloo:` /
    `nccl:`), paired with `GroupSpy`'s ranges (module docstring). An unpaired event takes the group of
    the paired events of its thread (gloo runs a group's work on that group's own threads: DTensor's
    reduction of `clip_grad_norm_` runs on the shard group's), else the world."""
    ranges = sorted((e.time_range.start, i, e.name) for i, e in enumerate(events) if e.name.startswith(LABEL))
    used, out, unpaired, of_thread = set(), {}, [], {}
    for e in sorted((e for e in events if e.name.startswith(("gloo:", "nccl:"))), key=lambda e: e.time_range.start):
        shape = e.input_shapes[0] if e.input_shapes else []
        elements = math.prod(shape) if shape else 1
        match = next((r for r in ranges if r[1] not in used and r[0] <= e.time_range.start
                      and int(r[2].rsplit(" ", 1)[1]) == elements), None)
        if match is None:
            unpaired.append(e)
            continue
        used.add(match[1])
        out[id(e)] = [int(r) for r in match[2][len(LABEL):].rsplit(" ", 1)[0].split(",")]
        of_thread.setdefault(getattr(e, "thread", None), out[id(e)])
    for e in unpaired:
        out[id(e)] = of_thread.get(getattr(e, "thread", None), list(range(world)))
    return out
