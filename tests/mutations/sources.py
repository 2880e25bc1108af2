"""Where DP/ZeRO code has shipped each bug class of the catalogue (`tests.mutations.CATALOGUE`): a
public issue, pull request or changelog that was found and read (never an invented address), and what it
shows, in a phrase. The catalogue gives each entry its `source` from here; docs/MUTATIONS.md renders it.
The three detection-limit probes are not shipped bugs and say so."""
from __future__ import annotations

SOURCES = {
    'missing-1/N': ('https://github.com/tensorflow/benchmarks/issues/466',
        'gradients summed, never averaged, in replicated mode'),
    'summed-twice': ('https://github.com/jax-ml/jax/issues/3970',
        "the gradient of a psum'd loss (the SPMD transpose); sony/nnabla#1120: SyncBN's gradients all-reduced twice"),
    'clip-shard-norm': ('https://github.com/pytorch/xla/pull/4796',
        'ZeRO-1 clipping: the local norm reduced across shards'),
    'accum-K-1': ('https://github.com/huggingface/transformers/pull/34191',
        'the 2024 gradient-accumulation loss normalisation fix'),
    'stale-grads': ('https://github.com/meta-pytorch/torchforge/pull/71',
        'gradients not zeroed after each step'),
    'decay-one-shard': ('https://github.com/dylanyunlon/Neuron_SP/issues/13',
        "weight decay that depends on the rank's shard"),
    'bucket-twice': ('https://github.com/hpcaitech/ColossalAI/issues/247',
        'ZeRO with accumulation: gradients reduced several times'),
    'bf16-reduction': ('https://github.com/jax-ml/jax/issues/27496',
        'the partitioner reduces the gradients in half precision'),
    'bn-local-stats': ('https://github.com/tensorflow/tensorflow/issues/18222',
        'BatchNorm statistics per GPU, not synchronised'),
    'bn-no-backward-reduce': ('https://github.com/pytorch/pytorch/pull/36382',
        "SyncBN's backward missed the reduced mean_dy terms: wrong dgrad"),
    'lr-1.00001x': ('',
        'a detection-limit probe of the judge (issue 23), not a shipped bug'),
    'decay-skipped-once': ('',
        'a detection-limit probe of the judge (issue 23), not a shipped bug'),
    'adam-eps-1e-6': ('https://github.com/uds-lsv/bert-stable-fine-tuning/issues/5',
        "Adam's eps 1e-6 in the paper, 1e-8 in the scripts"),
    'one-element': ('',
        'a detection-limit probe of the judge (issue 23), not a shipped bug'),
    'decay-one-replica': ('https://github.com/huggingface/nanotron/pull/37',
        'ZeRO-0 optimizer states not in sync across ranks'),
    'hsdp-wrong-axis': ('https://github.com/pytorch/pytorch/pull/125484',
        'HSDP: micro-batches reduce-scattered but not all-reduced across the replica group'),
    'zero-gather-offset': ('https://github.com/NVIDIA/Megatron-LM/pull/6500',
        'FSDP shards at different flat-buffer offsets: mismatched elements combined'),
    'clip-before-reduce': ('https://github.com/tensorflow/tensorflow/issues/25806',
        'DistributionStrategy clipped before the gradient reduction'),
    'loss-scale-kept': ('https://github.com/milesial/Pytorch-UNet/issues/468',
        'scaled gradients clipped and stepped (unscale_ missing)'),
    'decay-wrong-set': ('https://github.com/ServiceNow/Fast-LLM/issues/542',
        'norm weights and biases no longer excluded from weight decay'),
    'adam-beta-typo': ('https://github.com/karpathy/convnetjs/pull/70',
        "Adam's beta2 0.99 fixed to the paper's 0.999"),
    'tied-grad-once': ('https://github.com/NVIDIA/Megatron-LM/issues/844',
        'wrong shared-embedding gradients with the distributed optimizer'),
    'overlapping-rows': ('https://github.com/NVlabs/LongLive/issues/71',
        "ranks' samplers overlap, and skip samples"),
    'stale-micro-batch': ('https://github.com/michaelnny/InstructLLaMA/issues/6',
        'gradient accumulation always reads the same data'),
    'bucket-missing-1/N': ('https://github.com/pytorch/pytorch/issues/36516',
        'DDP divides the bucket contents by the wrong count'),
    'leaf-skipped': ('https://github.com/NVIDIA/Megatron-LM/issues/1446',
        "final_layernorm's gradient not all-reduced under TP + SP"),
}


def cite(name: str) -> str:
    """The source of class `name` in one line: the address, then what it shows."""
    url, what = SOURCES.get(name, ("", "no source recorded"))
    return f"{url} ({what})" if url else what
