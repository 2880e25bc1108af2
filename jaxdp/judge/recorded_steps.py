"""A recorded trace's steps as the judge's replays read them (`error_model.replay`, `decay_split.envelope`):
each step's gradients and the parameters before it, in float64, and the clipping coefficient the nominal
optimizer applies to those gradients."""
from __future__ import annotations

import math

import numpy as np

CLIP_EPS = 1e-6  # torch.nn.utils.clip_grad_norm_'s: coef = max_norm / (norm + 1e-6)


def steps(t, names):
    """(k, count, grads, params) for each step of trace `t` from its first: `count` the optimizer's step count
    (1 at the trace's first step), `grads` the step's recorded gradients and `params` the parameters before it
    (p_(k-1): `init/` at the first step), float64, {name: array}. Stops at the first step missing a gradient
    of `names` (or with another shape), and before a step after a malformed parameter (the judge names it)."""
    params = {n: np.asarray(t.arrays[f"init/{n}"], np.float64) for n in names}
    for k in range(t.first_step, t.steps + 1):
        keys = {n: f"step/{k}/grad/{n}" for n in names}
        if not all(key in t.arrays and np.shape(t.arrays[key]) == params[n].shape for n, key in keys.items()):
            return
        grads = {n: np.asarray(t.arrays[key], np.float64) for n, key in keys.items()}
        yield k, k - t.first_step + 1, grads, params
        after = {n: np.asarray(t.arrays.get(f"step/{k}/param/{n}", params[n]), np.float64) for n in names}
        if any(after[n].shape != params[n].shape for n in names):
            return
        params = after


def clip_coefficient(clip_norm: float, grads: dict) -> float:
    """The factor torch's clip_grad_norm_ scales the step's gradients by (their global norm); 1 without clipping."""
    if clip_norm <= 0:
        return 1.0
    norm = math.sqrt(sum(float(np.sum(g * g)) for g in grads.values()))
    return min(clip_norm / (norm + CLIP_EPS), 1.0)
