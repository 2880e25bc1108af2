"""The error model where the optimizer cannot be replayed: a trace whose meta lacks the optimizer's
settings (`optimizer`, `lr`, ...: a user's trace recorded without them), or a pair compared from a
later step (resumed: no optimizer state to replay from). What can still be modelled is how far the
two runs' gradients disagree, element by element, and that is what the updates are judged against.

For an element i at step k, with r_i = |g_a - g_b| / max(|g_a|, |g_b|) (0 where both are equal,
1 where one is 0 and the other is not), its worst over the steps so far, R_i = max_(j <= k) r_i(j):
    update/<k>/<name>      A_i = KAPPA R_i max(|du_a|, |du_b|) + ulp(p_k)
    step/<k>/param/<name>  the sum over j <= k of KAPPA R_i(j) max(|du_a|, |du_b|)(j)
Any elementwise optimizer carries a relative difference of its inputs into its update: SGD as is
(|du_a - du_b| = r |du|), momentum as the worst of its history's, Adam's m / (sqrt(v) + eps) as m's
plus half of v's (r + 2r / 2: KAPPA = 2). So an element whose gradients are roundoff only (r ~ 1: a
fused key bias under Adam) may move by its own update's size, and one whose gradients agree to
roundoff (r ~ u) by u times it: a learning rate, a skipped decay, a wrong eps on any element with a
resolved gradient still fails. An element whose two gradients are equal gets no allowance.

What this cannot see, and the replay can: a bug confined to elements whose gradients already differ
by as much as the bug (the replay's limit too), and a bug that moves an element by less than R_i of
its update. The diff's note says which model judged the pair and how to record the settings.
"""
from __future__ import annotations

import numpy as np

from .error_model import Allowance, storage

KAPPA = 2.0  # Adam: m's relative error plus half of v's (module docstring)


def disagreement(ga, gb) -> np.ndarray:
    """r = |g_a - g_b| / max(|g_a|, |g_b|), elementwise: 0 where equal, 0 where not finite (the judge
    names non-finite values itself and never excuses them)."""
    ga, gb = np.asarray(ga, np.float64), np.asarray(gb, np.float64)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        r = np.abs(ga - gb) / np.maximum(np.abs(ga), np.abs(gb))
    return np.where(np.isfinite(r), r, 0.0)


def fill(a, b, out: Allowance, updates: tuple) -> Allowance:
    """`out` (an Allowance without an optimizer) with the gradient-explained allowances of the
    module docstring; `updates`: both traces' updates (`trace.updates`)."""
    ua, ub = updates
    names = [n for n in b.names() if f"init/{n}" in a.arrays]
    worst: dict = {}
    total: dict = {}
    for k in range(max(a.first_step, b.first_step), min(a.steps, b.steps) + 1):
        for n in names:
            gkey, ukey = f"step/{k}/grad/{n}", f"update/{k}/{n}"
            if gkey not in a.arrays or gkey not in b.arrays or ukey not in ua or ukey not in ub:
                continue
            if np.shape(a.arrays[gkey]) != np.shape(b.arrays[gkey]) or np.shape(ua[ukey]) != np.shape(ub[ukey]):
                continue
            worst[n] = np.maximum(worst.get(n, 0.0), disagreement(a.arrays[gkey], b.arrays[gkey]))
            out.grads.update({("a", k, n): a.arrays[gkey], ("b", k, n): b.arrays[gkey]})
            with np.errstate(invalid="ignore", over="ignore"):
                size = np.maximum(np.abs(ua[ukey]), np.abs(ub[ukey]))
            allow = np.where(np.isfinite(size), KAPPA * worst[n] * size, 0.0)  # non-finite: never excused
            total[n] = total.get(n, 0.0) + allow
            out.param[f"step/{k}/param/{n}"] = total[n]
            out.update[ukey] = allow + storage(b, f"step/{k}/param/{n}")
    return out
