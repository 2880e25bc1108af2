"""The runs the bugs are injected into (`tests.mutations.CATALOGUE` names one per bug), and the dtypes
each family of bugs is judged in."""
from __future__ import annotations

from jaxdp.core.run.config import RunConfig

DTYPES = ("float64", "float32", "bfloat16")
# Small runs where every bug below is material: two or four devices, three micro-batches, several
# buckets. SGD where Adam's scale invariance would hide a bug that scales updates (clipping by the
# wrong norm, stale gradients) and with a weight decay large enough to matter (decay skipped).
BASE = RunConfig(model="mlp", data="synthetic", hidden=(16, 16), steps=4, batch_size=72, seed=3, devices=2)
ADAM = BASE.replace(optimizer="adam", lr=1e-3, weight_decay=0.01, accum=3, bucket_mb=0.002)
SGD = BASE.replace(optimizer="sgd", lr=0.05, weight_decay=0.5)
CLIP = SGD.replace(devices=4, clip_norm=0.05)
# cnn with synchronised BatchNorm (jaxdp/models/cnn.py, torch_ref/batchnorm.py): two devices, three
# micro-batches (the one batch layout: micro-batch j is the same rows on every strategy and N).
# Not in bfloat16: there the honest cnn runs already exceed parity's bf16 gradient bound (0.25) at
# bn1/bias (a sum of cotangents that the mean subtraction nearly cancels), so no bug could be judged.
CNN = RunConfig(model="cnn", data="digits", channels=(4, 4), batchnorm="sync", steps=3, batch_size=36, seed=3,
                devices=2, accum=3, optimizer="adam", lr=0.01)
CNN_DTYPES = ("float64", "float32")
# The small optimizer bugs (issue 23), on the model where the judge's error model relaxes elements:
# gpt2 with AdamW (nanoGPT's weight decay 0.1), whose fused key bias has a roundoff-only gradient.
# Each bug edits one tensor of the fused attention projection (the one of D x 3D, or 3D, elements):
# the bias holds the relaxed key third, so a bug next to it must still show. Not in bfloat16, whose
# bounds (2^-8 noise) are far above a 1e-5 change: docs/PARITY.md's detection limits say so.
GPT2 = RunConfig(model="gpt2", data="text", n_layer=1, n_head=2, d_model=16, seq_len=8, batch_size=12, steps=3,
                 seed=3, devices=2, optimizer="adamw", lr=1e-3, weight_decay=0.1)
FUSED_KERNEL = 3 * GPT2.d_model ** 2  # c_attn's kernel size
SMALL_DTYPES = ("float64", "float32")
# issue 70's classes: clipping before the reduction (ddp, N = 4, the threshold below the local norms),
# a static loss scale never undone, hsdp on 2 x 2.
CLIP_AT = CLIP.clip_norm
CLIP_DDP = CLIP
LOSS_SCALE = 1024.0
HSDP = ADAM.replace(devices=4, replicas=2)
