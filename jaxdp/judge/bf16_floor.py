"""The bf16 error model: the floor at the step's gradient scale for a gradient that is roundoff only,
and what that roundoff does to the loss through the parameters (docs/PARITY.md, "The bf16 floor").

A bf16 run (bf16 compute over fp32 master parameters, fp32 reduction and optimizer) rounds every
activation and every backward intermediate to 8 significant bits, u = 2^-8. A gradient that cancels
in exact arithmetic (an attention key bias: softmax ignores a shift; a BatchNorm scale or bias whose
terms nearly cancel) is then what those roundings leave, O(u) of the terms it sums, and two honest runs
disagree on it by O(1) of itself. As in float32 (`error_model.grad_floors`), the step's gradient norm
stands for the terms: a gradient's norm error is judged against max(||g_t||, C u ||g_step|| / bound).

C (`C_BF16`): the roundings along a backward chain of m rounded ops add like a random walk,
sqrt(m) u of the terms. Measured on honest pairs (`hf_honest.run_world`, the one-device reference against a
strategy, 4 steps):
the worst roundoff-dominated tensor, ResNet's BatchNorm (0.79 of a gradient 3.5% of the step's, ZeRO-2, N = 3,
momentum), up to 7 u ||g_step||; key biases 1e-8 to 3e-7 ||g_step||. C = 24 is 3.4x the worst (a chain 10x as
long) and the ceiling of the floor: a tensor's gradient doubled (error ||g_t||) is caught wherever
||g_t|| > 24 u ||g_step|| = 9.4% of the step's gradient norm.

The floor is also at most K_OTHERS = 1 times the two runs' gradient difference over the step's other tensors,
||d_rest||: a roundoff-only tensor is summed from terms of the step's scale through the same rounded chain as
the rest, so its disagreement is a part of the same roundoff, which the rest measures in place (ResNet's
BatchNorm 7 u against its convolutions' >= 36 u at step 1; a BERT key bias 3e-7 against 0.6 u). Where the
rest agrees (the project's mlp, BERT, ViT: ~1 u ||g_step|| or less), a doubled gradient is caught from about
that; a bug spread over the rest raises ||d_rest||, but then fails on the rest's own relative bounds.
Below the floor, a bug confined to one tensor's gradient is not seen by the gradient measure; the optimizer's
replay (`error_model.allowance`) excuses in the updates only what the two recorded gradients explain.

The gradients of step k > 1 may differ by what the parameters' accepted disagreement does to them
(`error_model.propagated`), which in bf16 is large: Adam turns the BatchNorm scales' noise into lr x O(1)
updates, and ResNet's largest kernel is 0.71 apart at step 4 (AdamW, N = 3), as far as a halved gradient. That
term need not point along the gradient; a wrong factor on a step's gradients does. So each step's scale along
B's, s_k = <g_a, g_b> / ||g_b||^2 over all tensors, is judged on its own (`scale_failures`): measured
|s_k - 1| <= 0.013 (mlp and gpt, Adam, 20 steps, jaxdp against torch_ref), <= 0.075 (ResNet, momentum) and
<= 0.23 (ResNet, Adam and AdamW, step 4); SCALE_BOUND 1/3 sits 1.5x above that and 1.5x below a halved
step (0.5).

The loss at step k is computed at parameters the judge accepts as up to A_(k-1) apart per element
(`error_model.Allowance.param`: the replayed optimizer's differences); to first order that moves the
loss by at most sum_i |g_(k,i)| A_(k-1,i) (the gradient of step k is the loss's at those parameters),
which `loss` adds to the loss's allowance. The constant bound (1e-2, 2.56 u: the forward's rounding of
the logits at identical parameters) stays for what that term does not explain.
"""
from __future__ import annotations

import numpy as np

from . import error_model

DTYPE = "bfloat16"
U = 2.0 ** -8  # bf16's unit roundoff
C_BF16 = 24  # in units of u ||g_step|| (module docstring)
K_OTHERS = 1.0  # a roundoff-only tensor's disagreement against the rest of its step's (module docstring)
SCALE_BOUND = 1 / 3  # |<g_a, g_b> / ||g_b||^2 - 1| per step (module docstring)


def apply(a, b, allow, grad_bound: float, elementwise_bound: float) -> None:
    """Make `allow` (error_model.allowance's, of a bf16 pair) the bf16 model: its gradient floors (`grad_floors`)
    and each step's loss allowance (`loss`); other dtypes' untouched."""
    if b.meta.get("dtype", a.meta.get("dtype")) != DTYPE:
        return
    allow.grad_floor = grad_floors(a, b, U, grad_bound, elementwise_bound)
    if allow.opt is not None:  # the replay's accepted parameter disagreement
        loss(a, b, allow)


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



def grad_floors(a, b, u: float, grad_bound: float, elementwise_bound: float) -> dict:
    """error_model.grad_floors for a bf16 pair: a tensor's norm floor is min(C u ||g_step||, K_OTHERS ||d_rest||)
    / bound, d_rest the two runs' gradient difference over the step's other tensors, with what the parameters'
    accepted disagreement does to the gradients (error_model.propagated) on top, as there."""
    out, squares, rho = {}, {}, {}
    for key, f in error_model.grad_floors(b, u * C_BF16 / error_model.C_GRAD, grad_bound, elementwise_bound).items():
        k = int(key.split("/")[1])
        if k not in squares:
            squares[k], rho[k] = _squares(a, b, k), error_model.disagreement(a, b, k)
        rest = np.sqrt(max(sum(squares[k].values()) - squares[k].get(key, 0.0), 0.0)) if key in squares[k] else np.inf
        moved = error_model.propagated(b, k, key, np.asarray(b.arrays[key], np.float64), rho[k])[0]
        capped = min(f.norm * grad_bound, K_OTHERS * float(rest))
        out[key] = error_model.GradFloor(max(capped, moved) / grad_bound, f.elementwise, f.step_norm,
                                         rho[k] if moved > capped else 0.0)
    return out


def _squares(a, b, k: int) -> dict:
    """{key: ||g_a - g_b||^2} of step k's gradients ({} where a trace lacks one or one is non-finite: no tightening)."""
    out = {}
    for key in (x for x in b.arrays if x.startswith(f"step/{k}/grad/")):
        if key not in a.arrays or np.shape(a.arrays[key]) != np.shape(b.arrays[key]):
            return {}
        out[key] = float(np.sum((np.asarray(a.arrays[key], np.float64) - np.asarray(b.arrays[key], np.float64)) ** 2))
    return out if all(np.isfinite(v) for v in out.values()) else {}


def scale_steps(a, b) -> list[tuple[int, float]]:
    """bf16: the steps whose gradient scale along B's, s_k = <g_a, g_b> / ||g_b||^2 over all tensors, is off by
    more than SCALE_BOUND, with s_k. The floors excuse a tensor's disagreement up to what roundoff and the
    parameters' accepted disagreement explain, which need not point along g; a wrong factor on a step's
    gradients does (halved: 0.5)."""
    if b.meta.get("dtype") != DTYPE:
        return []
    out = []
    for k in range(b.first_step, b.steps + 1):
        num = den = 0.0
        for n in b.names():
            ga, gb = a.arrays.get(f"step/{k}/grad/{n}"), b.arrays.get(f"step/{k}/grad/{n}")
            if ga is not None and gb is not None and np.shape(ga) == np.shape(gb):
                gb = np.asarray(gb, np.float64)
                num, den = num + float(np.sum(np.asarray(ga, np.float64) * gb)), den + float(np.sum(gb * gb))
        if den > 0 and np.isfinite(num) and abs(num / den - 1) > SCALE_BOUND:
            out.append((k, num / den))
    return out


def scale_failures(a, b) -> list[str]:
    """The first of `scale_steps` as the judge's failure line ('grad scale ...')."""
    for k, s in scale_steps(a, b)[:1]:
        return [f"grad scale {abs(s - 1):.2e} > {SCALE_BOUND:.3g} at step {k} (<g_a, g_b> / ||g_b||^2 "
                f"= {s:.3g} over the step's gradients)"]
    return []
