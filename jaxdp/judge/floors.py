"""The gradients' floors of the error model (jaxdp/judge/error_model.py): a gradient whose terms cancel is
roundoff only, judged at the step's gradient scale, and the parameters' accepted disagreement entering a step
moves its gradients (`propagated`). Read by error_model and by bf16_floor (which caps them for bf16)."""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

# Roundoff-only gradients (cnn's conv biases before BatchNorm, jaxdp and torch, N in 2..4) measured
# <= 9 u ||g_step|| in norm and <= 24 u max|g_step| per element; a sum's roundoff grows as the square
# root of its terms' count, so 256 covers ~100x the cnn's terms per gradient element.
C_GRAD = 256
K_PROP = 8  # gradients moved by the parameters' accepted disagreement: ~9x the measured need (`propagated`)


class GradFloor(NamedTuple):
    """A gradient's floors, the least ||b|| and |b_i| of its measures; ||g_step||; rho_k (`grad_floors`)."""
    norm: float
    elementwise: float
    step_norm: float
    rho: float  # the parameters' disagreement entering the step where it set the norm floor, else 0


def grad_floors(b, u: float, grad_bound: float, elementwise_bound: float, a=None) -> dict[str, GradFloor]:
    """{step/<k>/grad/<name>: GradFloor}: a gradient whose terms cancel (a bias before a normalisation) is
    roundoff only, ~u times the size of the terms, which the trace does not hold; the step's gradient stands
    for it (`C_GRAD`): a tensor's norm error is judged against max(||g_t||, C u ||g_step|| / bound), an
    element's against max(|g_i|, floor, C u max|g_step| / elementwise bound). With trace `a`, also what the
    parameters' accepted disagreement entering step k does to its gradients (`propagated`)."""
    out = {}
    for k in range(b.first_step, b.steps + 1):
        keys = [key for n in b.names() if (key := f"step/{k}/grad/{n}") in b.arrays]
        grads = [np.asarray(b.arrays[key], np.float64) for key in keys]
        if not grads or not all(np.isfinite(g).all() for g in grads):
            continue
        norm = math.sqrt(sum(float(np.sum(g * g)) for g in grads))
        top = max(float(np.max(np.abs(g))) if g.size else 0.0 for g in grads)
        rho = disagreement(a, b, k) if a is not None else 0.0
        for key, g in zip(keys, grads, strict=True):
            moved = propagated(b, k, key, g, rho)
            by_params = rho if moved[0] > C_GRAD * u * norm else 0.0
            out[key] = GradFloor(max(C_GRAD * u * norm, moved[0]) / grad_bound,
                                 max(C_GRAD * u * top, moved[1]) / elementwise_bound, norm, by_params)
    return out


def disagreement(a, b, k: int) -> float:
    """rho_k = ||p_a - p_b|| / ||du_b||, all tensors, entering step k: the two runs' parameters after step
    k - 1 apart, relative to B's update of that step (0 at the first step, whose parameters are identical,
    and where anything is missing or non-finite)."""
    if k <= b.first_step:
        return 0.0
    num = den = 0.0
    for n in b.names():
        pa, pb = a.arrays.get(f"step/{k - 1}/param/{n}"), b.arrays.get(f"step/{k - 1}/param/{n}")
        before = b.arrays.get(f"init/{n}" if k - 1 == b.first_step else f"step/{k - 2}/param/{n}")
        if pa is None or pb is None or before is None or np.shape(pa) != np.shape(pb):
            return 0.0
        pb = np.asarray(pb, np.float64)
        num += float(np.sum((np.asarray(pa, np.float64) - pb) ** 2))
        den += float(np.sum((pb - np.asarray(before, np.float64)) ** 2))
    rho = math.sqrt(num / den) if den > 0 else 0.0
    return rho if math.isfinite(rho) else 0.0


def propagated(b, k: int, key: str, g, rho: float) -> tuple[float, float]:
    """(norm, max) of the gradient change that parameters rho_k apart can make: K_PROP rho_k times the
    change of B's gradient over its own last step (a secant through the step's update, which also holds
    the batch's change: an upper estimate). Adam turns roundoff-level gradients into updates of lr x O(1)
    that differ between honest runs; a model whose key bias is such (Qwen2's, with rotary positions)
    then carries parameters ~1e-4 of a step apart into the next gradients (measured: K 0.9 needed)."""
    before = b.arrays.get(key.replace(f"step/{k}/", f"step/{k - 1}/", 1)) if rho > 0 else None
    if before is None or np.shape(before) != np.shape(g):
        return 0.0, 0.0
    change = np.abs(g - np.asarray(before, np.float64))
    return K_PROP * rho * float(np.linalg.norm(change)), K_PROP * rho * float(change.max(initial=0.0))
