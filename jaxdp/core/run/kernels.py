"""`--kernels`: which kernels a run computes with, in both frameworks (docs/KERNELS.md).

- `mirrored` (the default): the twins' op-for-op code, attention written out as einsums and a softmax, bf16
  by per-call casts (flax's `dtype=`, torch's autocast), the optimizers' reference loops. The fp32 and
  float64 reference: jaxdp and torch_ref then differ only by summation order.
- `fused`: each framework as its users run it. JAX: `jax.nn.dot_product_attention` (cuDNN's fused attention
  on NVIDIA GPUs, XLA's elsewhere) and, in bf16, the weights cast to bf16 once per step; XLA fuses the
  optimizer as it always does. PyTorch: `F.scaled_dot_product_attention` (flash or cuDNN on GPUs, the CPU
  flash kernel), in bf16 a bf16 copy of the weights per step instead of autocast (FSDP2's
  `MixedPrecisionPolicy` for the strategies built on `fully_shard`), and the fused optimizers
  (`AdamW(fused=True)`). `--compile` adds `torch.compile` on the torch side (jaxdp's step is always compiled).

float64 is the mirrored path's alone (`check`). The judge holds the fused path to the same bounds as the
mirrored one (docs/PARITY.md): a fused attention sums in another order, which the bounds already carry.
"""
from __future__ import annotations

from ..errors import ConfigError

KERNELS = ("mirrored", "fused")


def check(kernels: str, reduction: str, dtype: str) -> None:
    """One line naming the fix for a `--kernels` the run cannot take."""
    if kernels not in KERNELS:
        raise ConfigError(f"unknown kernels {kernels!r}; valid: {', '.join(KERNELS)}")
    if kernels == "fused" and dtype == "float64":
        raise ConfigError("--kernels fused has no float64 path (jax.nn.dot_product_attention takes its softmax in "
                          "float32 whatever the inputs, and GPUs' fused attention has no float64 kernel): use --dtype "
                          "float32 or bfloat16, or --kernels mirrored for the float64 reference")
    if kernels == "fused" and reduction == "canonical":
        raise ConfigError("--kernels fused sums in the kernels' own order (a GPU's fused attention and fused "
                          "optimizers fix no order), so --reduction canonical cannot give the same bits on any N: "
                          "drop --kernels fused (the canonical reference is mirrored) or use --reduction native")


def check_compile(compile: bool, reduction: str) -> None:
    """One line for a `--compile` the run cannot take (torch_ref compiles each unit: torch_ref/kernels.py)."""
    if compile and reduction == "canonical":
        raise ConfigError("--compile with --reduction canonical: inductor's kernels fix no summation order the "
                          "canonical tree could hold on any N; drop --compile or use --reduction native")
