"""`Recorder`: write the trace (docs/TRACE.md) from any training loop, step by step.

    settings = {"name": "adamw", "lr": 1e-3, "weight_decay": 0.01}   # what optax.adamw(...) was given
    with jaxdp.trace.Recorder("run.npz", {"framework": "jax", "model": "mine"}, optimizer=settings) as rec:
        rec.init(params)
        for k in range(1, steps + 1):
            state, metrics = par.step(state, x, y)
            rec.step(k, metrics["loss"], metrics["grads"], par.params(state), x, y)

Values may be jax arrays or NumPy, in nested dicts (Flax's layout, named as `jaxdp.models.flat_names`
names them: the path joined with '/') or already flat `{name: array}` dicts. Arrays that live partly
in other processes must be brought to the host first (`parallelize`'s metrics and `params` are).

The file is written atomically (`jaxdp.trace.save`) when the with-block ends normally, or on
`close()`. When the block raises, nothing is written and an earlier file at `path` stays as it was:
the trace's `meta` claims a complete run of `steps` steps, and a half-run file under that name
would be refused by `jaxdp diff` or, worse, mistaken for the run. (`arrays` still holds what was
recorded, for a caller that wants to save it under another name.)
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ..run import optimizer_settings
from .tracefile import save


def flat(tree, prefix: str = "") -> dict[str, np.ndarray]:
    """{'layers/0/kernel': array, ...} from nested dicts/lists/tuples (or a flat name dict)."""
    if isinstance(tree, Mapping):  # dicts, and flax's nnx.State
        items = tree.items()
    elif isinstance(tree, tuple) and hasattr(tree, "_fields"):  # a NamedTuple: by field name
        items = zip(tree._fields, tree, strict=True)
    elif isinstance(tree, (list, tuple)) and not hasattr(tree, "shape"):
        items = enumerate(tree)
    else:
        value = tree.get_value() if hasattr(tree, "get_value") else tree  # an nnx.Variable holds its array
        return {prefix: np.asarray(value)}
    out: dict[str, np.ndarray] = {}
    for key, child in items:
        out.update(flat(child, f"{prefix}/{key}" if prefix else str(key)))
    return out


def unflatten(flat_names: dict) -> dict:
    """The inverse of `flat`: {'layers/0/kernel': a} -> {'layers': {0: {'kernel': a}}} (all-digit
    parts become int keys, as NNX numbers list items)."""
    nested: dict = {}
    for name, leaf in flat_names.items():
        *parents, last = [int(p) if p.isdigit() else p for p in name.split("/")]
        node = nested
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = leaf
    return nested


class Recorder:
    """A trace being recorded: `init(params, state=None)`, then `step(...)` per step; written on close.

    `meta` is the trace's JSON header (framework, model, dtype...: what `jaxdp diff` compares);
    `steps` and `first_step` are filled in from the steps recorded unless given. `optimizer`: the
    settings the run trains with, a dict (`name`, `lr`, `weight_decay`, `betas`, `eps`, `momentum`,
    `clip_norm`; jaxdp/core/run/optimizer_settings.py), written into meta so that `jaxdp diff` replays
    that optimizer. `path` None keeps the arrays in memory only (`arrays`)."""

    def __init__(self, path, meta: dict | None = None, optimizer=None):
        self.path = path
        self.meta = optimizer_settings.merged(dict(meta or {}), optimizer)
        self.arrays: dict[str, np.ndarray] = {}
        self.steps: list[int] = []
        self.closed = False

    def init(self, params, state=None) -> None:
        """The parameters before step 1 (`init/<name>`) and non-trainable variables (`state/<name>`)."""
        self._put("init", params)
        if state is not None:
            self._put("state", state)

    def step(self, k: int, loss, grads, params, x=None, y=None, state=None) -> None:
        """Step `k`: its global mean loss, the full averaged gradient the update used (before
        clipping), the parameters after the update, the global batch, non-trainable variables."""
        if self.steps and k <= self.steps[-1]:
            raise ValueError(f"step {k} recorded after step {self.steps[-1]}; record steps in increasing order")
        self.steps.append(int(k))
        self.arrays[f"step/{k}/loss"] = np.asarray(loss, dtype=np.float64)
        if grads is not None:
            self._put(f"step/{k}/grad", grads)
        self._put(f"step/{k}/param", params)
        for key, value in (("x", x), ("y", y)):
            if value is not None:
                self.arrays[f"step/{k}/{key}"] = np.asarray(value)
        if state is not None:
            self._put(f"step/{k}/state", state)

    def _put(self, prefix: str, tree) -> None:
        for name, value in flat(tree).items():
            self.arrays[f"{prefix}/{name}"] = value

    def close(self) -> None:
        """Write the trace (once; nothing when `path` is None)."""
        if self.closed:
            return
        self.closed = True
        if self.steps:
            self.meta.setdefault("steps", self.steps[-1])
            self.meta.setdefault("first_step", self.steps[0])
        if self.path is not None:
            save(self.path, self.meta, self.arrays)

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
