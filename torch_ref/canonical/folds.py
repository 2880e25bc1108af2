"""This rank's part of the canonical sum, added as its shards finish: no stacked S/N x Psi buffer, no flat
copy of each shard's gradient; and the shard loop that feeds it (`shard_grads`: each shard's own backward).

The definition (reduce.py, docs/CANONICAL.md): shard i folds its micro-batches in order, a_i = ((g_0i +
g_1i) + g_2i) + ...; this rank's S/N folds are summed by the fixed binary tree, adjacent pairs level by
level. `Folds` computes exactly that association, in another order of time: a shard's fold is complete
with the last micro-batch's gradient, and the completed folds, arriving in shard order, go into a binary
counter (`levels[k]`: the sum of 2^k adjacent completed folds, or None), which adds left + right as soon
as both halves of a subtree exist. So it holds log2(S/N) + 1 sums at accumulation 1 (and the S/N
running folds at accumulation A > 1, which the definition needs until the last micro-batch).

Values are gradients as autograd hands them (a list of tensors, `grads`) or flat tensors; sums are
written into flat buffers this class allocated (`Owned`), or into gradients handed over as the caller's alone
(`OwnedList`: taken from `.grad`), in place from then on: element-wise addition rounds each element alone, so
`a.add_(b)`, `torch.add(a, b, out=c)` and `a + b` are the same bits. Any other tensor (autograd.grad's outputs,
which may alias one another or be expanded, DDP's bucket) is only read.
"""
from __future__ import annotations

import torch

from jaxdp.core.run.config import ConfigError

from ..tensors import micro_batches


class Owned:
    """A flat sum in a buffer this step allocated (added into in place)."""
    __slots__ = ("flat",)

    def __init__(self, flat: torch.Tensor):
        self.flat = flat


class OwnedList(Owned):
    """Per-parameter gradients that are the caller's alone, dense and unaliased (moved out of `.grad`: autograd's
    AccumulateGrad copies any gradient another tensor shares), added into in place as an `Owned` buffer is."""
    __slots__ = ("tensors",)

    def __init__(self, tensors):
        self.tensors = list(tensors)


def one_flat(value) -> bool:
    """Whether `value` is an `Owned` flat buffer (not an `OwnedList`)."""
    return isinstance(value, Owned) and not isinstance(value, OwnedList)


def parts(value) -> list:
    """A value's tensors: [t] for a tensor (an `Owned`'s flat buffer), the list itself for a list."""
    if isinstance(value, OwnedList):
        return value.tensors
    if isinstance(value, Owned):
        return [value.flat]
    return [value] if torch.is_tensor(value) else list(value)


def plus(left, right):
    """left + right, element-wise, with left's association: into the buffers of whichever side is `Owned`
    (left first), else into a new flat one. Either side may be flat or per parameter."""
    raw = [parts(v) for v in (left, right) if not one_flat(v)]
    shapes = [t.shape for t in max(raw, key=len)] if raw else [left.flat.shape]
    out = left if isinstance(left, Owned) else right if isinstance(right, Owned) else Owned(
        torch.empty(sum(s.numel() for s in shapes), dtype=parts(left)[0].dtype, device=parts(left)[0].device))
    for o, a, b in zip(_cut(out, shapes), _cut(left, shapes), _cut(right, shapes), strict=True):
        torch.add(a, b, out=o)  # the same kernel as a + b (out may be a or b: in place)
    return out


def _cut(value, shapes) -> list:
    """A value's tensors shaped as `shapes`: views of a flat one, else its own (already so)."""
    ts = parts(value)
    if len(ts) == len(shapes) and not one_flat(value):
        return ts
    flat, = ts
    return [v.view(s) for v, s in zip(flat.split([s.numel() for s in shapes]), shapes, strict=True)]


def flat(value) -> torch.Tensor:
    """A value as one flat tensor this step owns: an `Owned`'s buffer, else a copy."""
    return value.flat if one_flat(value) else torch.cat([t.reshape(-1) for t in parts(value)])


class Folds:
    """This rank's `local` shards of `accum` micro-batches: `add(i, value)` in order (micro-batch major,
    shard i minor); `partial()`, after the last, is the subtree over this rank's shards, flat."""

    def __init__(self, local: int, accum: int = 1, spare: list | None = None):
        self.local, self.accum, self.count, self.spare = local, accum, 0, spare
        self.acc: dict = {}       # shard i -> its fold over the micro-batches so far (accum > 1)
        self.levels: list = []    # levels[k]: the sum of 2^k completed adjacent folds, or None

    def plus(self, left, right):
        """`plus`, and an `Owned` operand whose buffer the sum did not go into is handed to `spare` (a
        list its owner allocates from again: a recycled buffer has its pages, a fresh one faults them)."""
        out = plus(left, right)
        if self.spare is not None and one_flat(right) and out is not right:
            self.spare.append(right.flat)
        return out

    def add(self, i: int, value) -> None:
        if i != self.count % self.local:
            raise ValueError(f"shard {i} added where shard {self.count % self.local} was due")
        last = self.count >= (self.accum - 1) * self.local  # the last micro-batch: shard i's fold completes
        self.count += 1
        if i in self.acc:
            value = self.plus(self.acc.pop(i), value)
        if last:
            self.push(value)
        else:
            self.acc[i] = value

    def push(self, value) -> None:
        """A completed fold, the next in shard order: carried up the counter (left + right)."""
        k = 0
        while k < len(self.levels) and self.levels[k] is not None:
            value, self.levels[k] = self.plus(self.levels[k], value), None
            k += 1
        if k == len(self.levels):
            self.levels.append(None)
        self.levels[k] = value

    def own(self) -> None:
        """Every value held as autograd's tensors copied into a flat buffer of its own, and theirs let go (ddp:
        each bucket then reads a view of it, and the step never holds both)."""
        self.acc = {i: self._owned(v) for i, v in self.acc.items()}
        self.levels = [None if v is None else self._owned(v) for v in self.levels]

    @staticmethod
    def _owned(value) -> Owned:
        return value if one_flat(value) else Owned(flat(value))

    def pending(self, select) -> Folds:
        """A copy holding `select(value)` of every value so far (ddp: one bucket's elements), to be
        completed by its own `add`s."""
        out = Folds(self.local, self.accum, self.spare)
        out.count = self.count
        out.acc = {i: select(v) for i, v in self.acc.items()}
        out.levels = [None if v is None else select(v) for v in self.levels]
        return out

    def partial(self, read_only: bool = False) -> torch.Tensor:
        """The subtree over this rank's shards (every shard of every micro-batch added), flat: a buffer the step
        owns, or with `read_only` (a caller that only reads it) a single flat tensor not ours as it is, uncopied."""
        done = [v for v in self.levels if v is not None]
        if self.count != self.local * self.accum or len(done) != 1:
            raise ValueError(f"{self.count} of {self.local * self.accum} shard values added")
        if read_only and torch.is_tensor(done[0]):
            return done[0].reshape(-1)
        return flat(done[0])


def shards_of(x, y, accum: int, local: int):
    """(j, i, x rows, y rows) of this rank's shard i of micro-batch j, in order."""
    for j, (xm, ym) in enumerate(micro_batches(x, y, accum)):
        for i, (xs, ys) in enumerate(zip(xm.chunk(local), ym.chunk(local), strict=True)):
            yield j, i, xs, ys


def shard_grads(module, params, x, y, loss_fn, accum: int, local: int):
    """This rank's partial sums (flat gradient, loss): each shard's from its own backward, folded over
    the micro-batches and into this rank's subtree as it comes (`Folds`)."""
    grads, losses = Folds(local, accum), Folds(local, accum)
    for _, i, xs, ys in shards_of(x, y, accum, local):
        loss = scalar(loss_fn(module(xs), ys))
        grads.add(i, grad_of(loss, params))
        losses.add(i, loss.detach())
    return grads.partial(), losses.partial()


def grad_of(loss: torch.Tensor, params) -> list:
    """d loss / d params in parameter order, by `autograd.grad` (no `.grad`, no strategy hook); zeros for
    a parameter the loss does not use."""
    grads = torch.autograd.grad(loss, params, allow_unused=True)
    return [torch.zeros_like(p) if g is None else g for p, g in zip(params, grads, strict=True)]


def scalar(loss) -> torch.Tensor:
    if not torch.is_tensor(loss) or loss.numel() != 1:
        shape = tuple(loss.shape) if torch.is_tensor(loss) else type(loss).__name__
        raise ConfigError(f"loss_fn returned {shape}, not a scalar tensor; return the mean loss of the rows, "
                          f"e.g. torch.nn.functional.cross_entropy(outputs, y)")
    return loss.reshape(())


def set_grads(params, flat: torch.Tensor) -> None:
    """Each parameter's `.grad`: its slice of `flat` (a view: `flat` is this step's own)."""
    offset = 0
    for p in params:
        p.grad = flat[offset:offset + p.numel()].view_as(p)
        offset += p.numel()
