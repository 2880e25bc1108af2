"""The catalogue's optimizer and data-sharding bugs in jaxdp (issue 70's classes): each a function returning
the (object, attribute, value) patches that put the bug into the optimizer's or the batch layout's code."""
from __future__ import annotations

import jax
import numpy as np
import optax

from jaxdp.core.run import data


def _matrices_only(params):
    """The usual "no decay" split: biases and norm scales (tensors of one dimension) excluded."""
    return jax.tree.map(lambda p: p.ndim >= 2, params)


def decay_wrong_set():
    """AdamW's (and coupled) weight decay masked to the matrices, where the run decays every tensor (the
    reverse bug, decaying what a run excludes, is the same wrong set seen from the other side)."""
    adamw, decayed = optax.adamw, optax.add_decayed_weights
    return [(optax, "adamw", lambda *a, **kw: adamw(*a, **{**kw, "mask": _matrices_only})),
            (optax, "add_decayed_weights", lambda wd, mask=None: decayed(wd, mask=_matrices_only))]


def adam_beta_typo():
    """Adam's and AdamW's beta2 0.99 where 0.999 was meant (identical at step 1: bias correction)."""
    adam, adamw = optax.adam, optax.adamw
    return [(optax, "adam", lambda *a, **kw: adam(*a, **{**kw, "b2": 0.99})),
            (optax, "adamw", lambda *a, **kw: adamw(*a, **{**kw, "b2": 0.99}))]


def overlapping_rows():
    """The batch split at a stride one row short of the block: device i reads rows [i (b - 1), i (b - 1) + b)
    of the laid-out batch (b rows a device), its last row device i + 1's first; the batch's last N - 1 rows
    are read by nobody."""
    micro_major = data.micro_major

    def overlapping(a, parts, accum):
        out = micro_major(a, parts, accum)
        b = len(out) // parts
        return out if parts == 1 else np.concatenate([out[i * (b - 1):i * (b - 1) + b] for i in range(parts)])

    return [(data, "micro_major", overlapping)]


PATCHES = {
    "decay-wrong-set": decay_wrong_set,
    "adam-beta-typo": adam_beta_typo,
    "overlapping-rows": overlapping_rows,
}
