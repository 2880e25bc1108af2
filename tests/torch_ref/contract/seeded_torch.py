"""Seeded misconfigurations in torch, each written the way a user writes it (DDP, FSDP2's fully_shard,
ZeroRedundancyOptimizer, torch.distributed), run for one step on every rank of a gloo world and checked with
`torch_ref.check`; honest twins beside them, the project's own strategies and a transformers GPT-2 under
torch's own wrappers. `run(rank, n)` returns {case: the report's dict} (rank 0's); the test module asserts.
`CASES`: name -> (the expected kind, None for an honest program)."""
from __future__ import annotations

import importlib.util

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP

import torch_ref

ROWS, FEATURES, HIDDEN, CLASSES = 8, 16, 32, 8


def net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, HIDDEN), nn.Tanh(),
                         nn.Linear(HIDDEN, CLASSES))


def batch(rank):
    g = torch.Generator().manual_seed(rank)
    return torch.randn(ROWS, FEATURES, generator=g), torch.randint(0, CLASSES, (ROWS,), generator=g)


def fsdp(model, **kw):
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, **kw)
    return fully_shard(model, **kw)


def accumulate(model, opt, x, y, k, before_micro=None):
    """k micro-batches, then one optimizer step; `before_micro(i)` opens each micro-batch's context."""
    for i, (xm, ym) in enumerate(zip(x.chunk(k), y.chunk(k), strict=True)):
        with before_micro(i) if before_micro else torch.enable_grad():
            F.cross_entropy(model(xm), ym).backward()
    opt.step()
    opt.zero_grad()


def check(model, opt, x, y, intent, k=1, before_micro=None, reduce_dtype="float32", step=None):
    step = step or (lambda: accumulate(model, opt, x, y, k, before_micro))
    return torch_ref.check(step, model=model, optimizer=opt, intent=intent, accumulation=k,
                           reduce_dtype=reduce_dtype).to_dict()


def adamw(params):
    return torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01)


def ddp_accumulation(x, y, no_sync: bool):
    model = DDP(net())
    opt = adamw(model.parameters())
    last = 1
    return check(model, opt, x, y, "ddp", 2,
                 (lambda i: model.no_sync() if i < last else torch.enable_grad()) if no_sync else None)


def fsdp_accumulation(x, y, deferred: bool):
    model = fsdp(net())
    opt = adamw(model.parameters())

    def micro(i):
        model.set_requires_gradient_sync(i == 1)
        return torch.enable_grad()
    return check(model, opt, x, y, "zero3", 2, micro if deferred else None)


def fsdp_mixed(x, y, reduce_dtype):
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=reduce_dtype)
    model = fsdp(net(), mp_policy=policy)
    return check(model, adamw(model.parameters()), x, y, "zero3")


def bf16_model(x, y, cast: bool):
    """bf16 training as `model.to(torch.bfloat16)` before fully_shard: the sharded parameters FSDP2 keeps and
    AdamW's moments are bf16 (no float32 master); the twin computes in bf16 from float32 through FSDP2's policy."""
    if cast:
        model = fsdp(net().to(torch.bfloat16))
        x = x.to(torch.bfloat16)
    else:
        model = fsdp(net(), mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32))
    return check(model, adamw(model.parameters()), x, y, "zero3")


def zero2_fsdp2(x, y, reshard: bool):
    """ZeRO-2 meant with FSDP2: `reshard_after_forward=False` (SHARD_GRAD_OP); its default (True) is ZeRO-3,
    the parameters gathered again in backward."""
    model = fsdp(net(), reshard_after_forward=reshard)
    return check(model, adamw(model.parameters()), x, y, "zero2")


def zero1(x, y, zero: bool):
    model = DDP(net())
    opt = (ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, lr=1e-3,
                                   weight_decay=0.01) if zero else adamw(model.parameters()))
    return check(model, opt, x, y, "zero1")


def manual_average(model):
    world = dist.get_world_size()
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= world


def averaged_by_hand(x, y, wrap):
    """The tutorial's `average_gradients` after `loss.backward()`: every gradient all-reduced once backward has
    finished (no overlap); on a DDP model (`wrap`), a second reduction of what DDP already averaged."""
    model = DDP(net()) if wrap else net()
    opt = adamw(model.parameters())

    def step():
        F.cross_entropy(model(x), y).backward()
        manual_average(model)
        opt.step()
    return check(model, opt, x, y, "ddp", step=step)


def unwrapped(x, y):
    """The process group initialised, the model never wrapped: no gradient is reduced."""
    model = net()
    return check(model, adamw(model.parameters()), x, y, "ddp")


def fsdp_as_ddp(x, y):
    model = fsdp(net())
    return check(model, adamw(model.parameters()), x, y, "ddp")


def plain_ddp(x, y):
    model = DDP(net())
    return check(model, adamw(model.parameters()), x, y, "ddp")


def fsdp_honest(x, y):
    model = fsdp(net())
    return check(model, adamw(model.parameters()), x, y, "zero3")


CASES = {  # name -> (expected kind or None for an honest program, the function, its arguments, the source)
    "ddp-accumulation-without-no_sync": ("sync-per-microbatch", ddp_accumulation, (False,),
                                         "https://github.com/pytorch/pytorch/issues/43201"),
    "ddp-accumulation-with-no_sync": (None, ddp_accumulation, (True,), ""),
    "fsdp2-accumulation-syncing-every-micro-batch": ("sync-per-microbatch", fsdp_accumulation, (False,),
                                                     "https://github.com/NVIDIA/cosmos-framework/issues/161"),
    "fsdp2-accumulation-deferred": (None, fsdp_accumulation, (True,), ""),
    "fsdp2-bf16-reduce-dtype-not-set": ("reduce-dtype", fsdp_mixed, (None,),
                                        "https://github.com/meta-pytorch/torchtune/issues/2267"),
    "fsdp2-bf16-reduce-dtype-float32": (None, fsdp_mixed, (torch.float32,), ""),
    "model-cast-to-bf16-before-fully_shard": ("master-dtype", bf16_model, (True,),
                                              "https://github.com/tianweiy/CausVid/issues/19"),
    "fsdp2-bf16-compute-from-float32-master": (None, bf16_model, (False,), ""),
    "zero2-with-fully_shard-defaults": ("gathered-too-often", zero2_fsdp2, (True,),
                                        "https://github.com/radixark/miles_diffusion/pull/196"),
    "zero2-fully_shard-reshard_after_forward-False": (None, zero2_fsdp2, (False,), ""),
    "zero1-without-ZeroRedundancyOptimizer": ("state-replicated", zero1, (False,),
                                              "https://github.com/pytorch/tutorials/pull/1375"),
    "zero1-ZeroRedundancyOptimizer": (None, zero1, (True,), ""),
    "naive-all-reduce-after-backward": ("no-overlap", averaged_by_hand, (False,),
                                        "https://github.com/pytorch/tutorials/issues/2305"),
    "ddp-plus-manual-all-reduce": ("extra-gradient-sync", averaged_by_hand, (True,),
                                   "https://github.com/kubeflow/pytorch-operator/issues/122"),
    "model-never-wrapped": ("no-gradient-sync", unwrapped, (), "https://github.com/pytorch/examples/issues/374"),
    "fsdp2-where-ddp-was-meant": ("unexpected-gather", fsdp_as_ddp, (), ""),
    "ddp": (None, plain_ddp, (), ""),
    "fsdp2": (None, fsdp_honest, (), ""),
}


def project(x, y, strategy: str, k: int, compute_dtype=None):
    """A project strategy, built by torch_ref's own API, checked against the layout it stands for (bf16
    compute: over float32 masters, the gradients reduced in float32)."""
    from jaxdp.core.contract.intent import of_strategy

    model, opt = torch_ref.parallelize(net(), strategy=strategy, optimizer=adamw, accum=k, compute_dtype=compute_dtype)
    return check(model, opt, x, y, of_strategy(strategy).name, k,
                 step=lambda: torch_ref.train_step(model, opt, x, y, F.cross_entropy))


def gpt2(wrap: str):
    """A transformers GPT-2 (tiny config, no download: tied embeddings, fused attention projections) under
    torch's own DDP or FSDP2 (each block, then the root), one step of its language-model loss."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=2))
    if wrap == "fsdp2":
        for block in model.transformer.h:
            fully_shard(block)
        model = fully_shard(model)
    else:
        model = DDP(model)
    opt = adamw(model.parameters())
    ids = torch.randint(0, 64, (4, 16), generator=torch.Generator().manual_seed(dist.get_rank()))

    def step():
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad()
    return check(model, opt, ids, ids, "zero3" if wrap == "fsdp2" else "ddp", step=step)


PROJECT = ("dp", "ddp", "ddp-naive", "ddp-bucket", "ddp-ring", "zero1", "zero2", "zero3", "ddp-jit", "zero1-jit",
           "fsdp-jit")  # hsdp needs a grid of R x S > 1 ranks each: a world of 2 holds none


def run(rank: int, n: int, names=None) -> dict:
    x, y = batch(rank)
    out = {}
    for name, (_, fn, args, _) in CASES.items():
        if names is None or name in names:
            out[name] = fn(x, y, *args)
    for strategy in PROJECT:
        for k in (1, 2):
            out[f"torch_ref {strategy} accum {k}"] = project(x, y, strategy, k)
        out[f"torch_ref {strategy} bf16"] = project(x, y, strategy, 1, torch.bfloat16)
    for wrap in ("ddp", "fsdp2") if importlib.util.find_spec("transformers") else ():  # the hf extra
        out[f"transformers gpt2 under {wrap}"] = gpt2(wrap)
    return out if rank == 0 else {}


def hsdp_fsdp2(x, y, mesh_2d: bool):
    """HSDP meant with FSDP2: a 2-D (replicate, shard) DeviceMesh; without one, fully_shard shards over the
    whole world (FSDP), with no replica groups."""
    from torch.distributed.device_mesh import init_device_mesh

    world = dist.get_world_size()
    mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("replicate", "shard")) if mesh_2d else None
    model = fsdp(net(), mesh=mesh) if mesh_2d else fsdp(net())
    return check(model, adamw(model.parameters()), x, y, "hsdp")


HSDP_CASES = {"fsdp2-1d-mesh-where-hsdp-was-meant": ("wrong-axis", hsdp_fsdp2, (False,),
                                                     "https://github.com/meta-pytorch/tnt/pull/1077"),
              "fsdp2-2d-mesh": (None, hsdp_fsdp2, (True,), "")}


def run_hsdp(rank: int, n: int) -> dict:
    """A world of 4 ranks (2 replicas of 2 shards): hsdp needs shard groups of more than one rank."""
    x, y = batch(rank)
    out = {name: fn(x, y, *args) for name, (_, fn, args, _) in HSDP_CASES.items()}
    model, opt = torch_ref.parallelize(net(), strategy="hsdp", optimizer=adamw, replicas=2)
    out["torch_ref hsdp"] = check(model, opt, x, y, "hsdp",
                                  step=lambda: torch_ref.train_step(model, opt, x, y, F.cross_entropy))
    return out if rank == 0 else {}
