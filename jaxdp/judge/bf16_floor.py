"""The bf16 error model: the floor at the step's gradient scale for a gradient that is roundoff only,
and what that roundoff does to the loss through the parameters (docs/PARITY.md, "The bf16 floor").

A bf16 run (bf16 compute over fp32 master parameters, fp32 reduction and optimizer) rounds every
activation and every backward intermediate to 8 significant bits, u = 2^-8. A gradient that cancels
in exact arithmetic (an attention key bias: softmax ignores a shift; a BatchNorm scale or bias whose
terms nearly cancel) is then what those roundings leave, O(u) of the terms it sums, and two honest runs
disagree on it by O(1) of itself. As in float32 (`error_model.grad_floors`), the step's gradient norm
stands for the terms: a gradient's norm error is judged against max(||g_t||, C u ||g_step|| / bound).

C (`C_BF16`): the roundings along a backward chain of m rounded ops add like a random walk,
sqrt(m) u of the terms; the worst honest disagreements measured (docs/results/honest.json before the
floor) are 7.1 u ||g_step|| (ResNet's BatchNorm, step 4, zero2, N=3, momentum: 0.79 of a gradient
3.5% of the step's) and 3e-7 ||g_step|| (key biases), i.e. m ~ 50 rounded ops: the families' depth
(embedding, a few blocks of ~10 ops, head). C = 16 covers chains 4x as long (sqrt 4 = 2x) and is the
detection limit: a tensor's gradient doubled (error ||g_t||) is caught where ||g_t|| > C u ||g_step||
= 1/16 of the step's gradient norm; below that a bug confined to that tensor's gradient is not seen
by the gradient measure (its update through the optimizer still is, `error_model.allowance`'s replay
excusing only what the two recorded gradients explain).

The loss at step k is computed at parameters the judge accepts as up to A_(k-1) apart per element
(`error_model.Allowance.param`: the replayed optimizer's differences); to first order that moves the
loss by at most sum_i |g_(k,i)| A_(k-1,i) (the gradient of step k is the loss's at those parameters),
which `loss` adds to the loss's allowance. The constant bound (1e-2, 2.56 u: the forward's rounding of
the logits at identical parameters) stays for what that term does not explain.
"""
from __future__ import annotations

import numpy as np

DTYPE = "bfloat16"
C_BF16 = 24  # in units of u ||g_step|| (module docstring)


def scaled_unit(dtype: str, u: float, c_grad: float) -> float:
    """The unit roundoff that makes error_model.grad_floors (C_GRAD u ||g_step||) floor a bf16 gradient at
    C_BF16 u ||g_step||; `u` unchanged for other dtypes."""
    return u * C_BF16 / c_grad if dtype == DTYPE else u


def loss(a, b, allow) -> None:
    """Add to `allow.param` each step's loss allowance (absolute): sum_i |g_(k,i)| A_(k-1,i), with A the
    accepted parameter disagreement after step k - 1 (none at the first step: identical parameters)."""
    for k in range(b.first_step + 1, b.steps + 1):
        key = f"step/{k}/loss"
        if key not in a.arrays or key not in b.arrays:
            continue
        total = 0.0
        for n in b.names():
            g, A = b.arrays.get(f"step/{k}/grad/{n}"), allow.param.get(f"step/{k - 1}/param/{n}")
            if g is not None and A is not None and np.shape(g) == np.shape(A):
                total += float(np.sum(np.abs(np.asarray(g, np.float64)) * A))
        if np.isfinite(total) and total > 0:
            allow.param[key] = np.float64(total)
