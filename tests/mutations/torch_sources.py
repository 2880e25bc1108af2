"""Where PyTorch DP code has shipped the torch form of each new bug class (`torch_sync_bugs`, `torch_step_bugs`): a
public issue or pull request found with the issue search and read (never an invented address), and what it shows,
in `sources.SOURCES`' format (address, phrase). The catalogue's own source of each class is `sources.SOURCES`;
these are the torch plants' (`cite`)."""
from __future__ import annotations

TORCH = {
    'hsdp-wrong-axis': ('https://github.com/meta-pytorch/torchtune/pull/2415',
        "HSDP in torchtune: the gradients' reduce-scatter ran across all devices, not within the replica"),
    'zero-gather-offset': ('https://github.com/deepspeedai/DeepSpeed/issues/2343',
        'ZeRO stage 2: faulty gradients when ranks order their partitions differently'),
    'clip-before-reduce': ('https://github.com/horovod/horovod/issues/1346',
        "Horovod's TensorFlow and MXNet optimizers clip locally, before the allreduce"),
    'loss-scale-kept': ('https://github.com/pytorch/examples/issues/1196',
        "minGPT-ddp's trainer clips the gradients while they are still scaled (no scaler.unscale_)"),
    'decay-wrong-set': ('https://github.com/ServiceNow/Fast-LLM/pull/545',
        'a refactor dropped weight_decay=False: norm weights and biases decayed'),
    'adam-beta-typo': ('https://github.com/karpathy/convnetjs/pull/70',
        "Adam's beta2 0.99 set to the paper's 0.999"),
    'tied-grad-once': ('https://github.com/verl-project/verl/issues/7834',
        'FSDP with tied embeddings: the naive fix unties the model silently'),
    'overlapping-rows': ('https://github.com/Lightning-AI/pytorch-lightning/pull/17713',
        'DDP ranks read overlapping samples when no global seed is set'),
    'stale-micro-batch': ('https://github.com/NVIDIA/Megatron-LM/pull/4609',
        "stale data left in the gradient buffer that the next backward accumulates onto"),
    'bucket-missing-1/N': ('https://github.com/pytorch/pytorch/pull/42400',
        "a DDP comm hook's bucket is not divided by world_size: the hook must divide it"),
    'leaf-skipped': ('https://github.com/pytorch/pytorch/issues/69031',
        'DDP syncs only the parameters used in the last pass: the others never all-reduced'),
}


def cite(name: str) -> str:
    """The torch plant's source of class `name` in one line (empty when it has none of its own)."""
    url, what = TORCH.get(name, ("", ""))
    return f"{url} ({what})" if url else ""
