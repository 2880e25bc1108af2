"""`--kernels fused`'s attention (docs/KERNELS.md), the twin of `jaxdp/models/attention.py`: causal
`F.scaled_dot_product_attention`, the one call gpt, gpt2 and llama make under `kernels="fused"`.

torch picks the kernel: the flash, cuDNN or memory-efficient one on a GPU, the CPU flash kernel (or the
math one, e.g. for float64) on CPU. Its sums run in the kernel's own order (blocks of keys, an online
softmax), so it agrees with the mirrored attention to roundoff, not bit for bit.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

KERNELS = ("mirrored", "fused")


def checked(kernels: str) -> str:
    """`kernels`, or one ValueError line naming the valid values."""
    if kernels not in KERNELS:
        raise ValueError(f"unknown kernels {kernels!r}; valid: {', '.join(KERNELS)}")
    return kernels


def fused(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal attention of q [b, t, heads, d] over k, v [b, t, kv_heads, d] -> [b, t, heads, d], scaled
    by 1/sqrt(d). kv_heads < heads (grouped-query): query head j reads kv head j // (heads / kv_heads),
    SDPA's `enable_gqa` mapping and transformers' `repeat_kv`."""
    gqa = k.shape[2] != q.shape[2]
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True,
                                         enable_gqa=gqa)
    return out.transpose(1, 2)


def backend(dtype: torch.dtype, device: torch.device, heads: int = 2, kv_heads: int = 2, head_dim: int = 8) -> str:
    """The SDPA backend torch chooses for a causal call of these heads in `dtype` on `device` (e.g.
    'flash_attention', 'cudnn_attention', 'math'), asked of torch's own chooser (`torch._fused_sdp_choice`);
    'unknown' where it cannot say."""
    from torch.nn.attention import SDPBackend

    q = torch.zeros(1, heads, 16, head_dim, dtype=dtype, device=device)
    kv = torch.zeros(1, kv_heads, 16, head_dim, dtype=dtype, device=device)
    try:
        choice = torch._fused_sdp_choice(q, kv, kv, None, 0.0, True, enable_gqa=heads != kv_heads)
        return SDPBackend(choice).name.lower()
    except (AttributeError, RuntimeError, TypeError, ValueError):
        return "unknown"
