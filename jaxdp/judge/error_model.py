"""The error model behind the judge's update, parameter and gradient measures: how far apart two
honest runs' updates may be, element by element, given the gradients they recorded, and at what
scale a gradient that is roundoff only is judged (docs/PARITY.md, "The error model per element").

Two honest runs compute the same gradients in different summation orders. The judge bounds that
difference where it arises, on the gradients (the `grad` bound). An optimizer is a function U of the
gradients so far and the parameters, and what the gradient check accepts must be accepted after U too,
and no more:

    du_a - du_b = [U(g_a, p_a) - U(g_b, p_b)] + (r_a - r_b)

where r is each run's own rounding: of the update arithmetic (a few unit roundoffs of |du|: what the
update bounds were derived for), and of storing p_k in its dtype (`storage`: one ulp). The first term
is computed here, exactly (float64), by replaying the run's nominal optimizer (meta `optimizer`, `lr`,
`weight_decay`, `clip_norm`; Adam's betas and eps, SGD's momentum: torch's defaults unless meta gives
`adam_betas`, `adam_eps`, `momentum`) on each trace's own recorded gradients and parameters. With the
storage term it is each element's **allowance**:
    update/<k>/<name>      A_k = |U_k(g_a, p_a) - U_k(g_b, p_b)| + ulp(p_k)
    step/<k>/param/<name>  the sum over j <= k of |U_j(g_a, p_a) - U_j(g_b, p_b)|
and the judge measures only the excess, max(|a - b| - A, 0), against its unchanged bounds.

For an element whose gradient is well above its roundoff, A is a few roundoffs of the update and
changes nothing. For one whose gradient is zero in exact arithmetic (a fused key bias, a bias before
a normalisation), Adam's m / (sqrt(v) + eps) turns two different roundoffs (3e-20) into two different
updates (lr x 3e-20 / eps = 3e-15), and A is exactly that difference. What A cannot hide: any change
the optimizer makes that its gradients do not explain (a learning rate, eps, weight decay, a skipped
or wrong update of any element whose gradient is resolved), since U is the nominal optimizer, not the
run's; and a wrong gradient, which the gradient bound judges directly. The limit: an element whose
two gradients differ by as much as the element itself has an update that roundoff alone decides, and
a bug confined to such elements is not seen.

A gradient whose terms cancel is roundoff only as a whole tensor (a bias before BatchNorm): its error
relative to itself is O(1), so it is judged at the step's gradient scale (`grad_floors`).

Applied to float64, float32 and bf16 runs (bf16's gradient floors and its loss term replace these:
jaxdp/judge/bf16_floor.py `apply`, which the judge calls after `allowance`).
A resumed trace (no optimizer state to replay from) or an
optimizer meta does not name gets the gradient floors and the gradient-explained allowances of
jaxdp/judge/unmodelled.py instead of a replay, which the notes say.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from ..core.registry import strategies as registry
from ..core.traces.trace import errors
from . import precision, recorded_steps

OPTIMIZERS = ("sgd", "momentum", "adam", "adamw")
DTYPES = ("float64", "float32")  # the derived bounds' (resolution.py)
MODELLED = DTYPES + ("bfloat16",)  # the allowances' (bfloat16's floors and loss: jaxdp/judge/bf16_floor.py)
UNIT = {"float64": 2.0 ** -53, "float32": 2.0 ** -24}  # unit roundoff u
# Roundoff-only gradients (cnn's conv biases before BatchNorm, jaxdp and torch, N in 2..4) measured
# <= 9 u ||g_step|| in norm and <= 24 u max|g_step| per element; a sum's roundoff grows as the square
# root of its terms' count, so 256 covers ~100x the cnn's terms per gradient element.
C_GRAD = 256
K_PROP = 8  # gradients moved by the parameters' accepted disagreement: ~9x the measured need (`propagated`)


@dataclass(frozen=True)
class Optimizer:
    """The nominal optimizer of a trace (torch.optim semantics; jaxdp/optim.py builds the same)."""
    name: str
    lr: float
    weight_decay: float = 0.0
    clip_norm: float = 0.0
    betas: tuple = (0.9, 0.999)
    eps: float = 1e-8
    momentum: float = 0.9

    def describe(self) -> str:
        if self.name in ("adam", "adamw"):
            return f"{self.name} (lr {self.lr:g}, eps {self.eps:g}, weight decay {self.weight_decay:g})"
        return f"{self.name} (lr {self.lr:g}, weight decay {self.weight_decay:g})"


def optimizer_of(meta: dict) -> Optimizer | None:
    """The optimizer a trace's meta names, or None when it names none this model knows."""
    name, lr = meta.get("optimizer"), meta.get("lr")
    if name not in OPTIMIZERS or not isinstance(lr, (int, float)):
        return None
    return Optimizer(name, float(lr), float(meta.get("weight_decay", 0.0) or 0.0),
                     float(meta.get("clip_norm", 0.0) or 0.0), tuple(meta.get("adam_betas", (0.9, 0.999))),
                     float(meta.get("adam_eps", 1e-8)), float(meta.get("momentum", 0.9)))


class GradFloor(NamedTuple):
    """A gradient's floors, the least ||b|| and |b_i| of its measures; ||g_step||; rho_k (`grad_floors`)."""
    norm: float
    elementwise: float
    step_norm: float
    rho: float  # the parameters' disagreement entering the step where it set the norm floor, else 0


@dataclass
class Allowance:
    """Per-element allowances (key -> array, float64), the gradients' floors, and what they came from."""
    opt: Optimizer | None  # None: no optimizer to replay (resumed, or none named): gradient floors only
    update: dict = field(default_factory=dict)  # update/<k>/<name>
    param: dict = field(default_factory=dict)  # step/<k>/param/<name>
    grads: dict = field(default_factory=dict)  # (side, k, name) -> the recorded gradient, for explanations
    grad_floor: dict[str, GradFloor] = field(default_factory=dict)  # step/<k>/grad/<name>

    def of(self, key: str):
        return self.update.get(key, self.param.get(key))

    def errors(self, key: str, a, b, floor: float) -> tuple[float, float, float]:
        """trace.errors of one array under the model: beyond its allowance, above its floors."""
        norm_floor, elem_floor = self.grad_floor.get(key, GradFloor(0.0, 0.0, 0.0, 0.0))[:2]
        return errors(a, b, max(floor, elem_floor), self.param.get(key), norm_floor)


def why_none(a, b, dtypes=DTYPES) -> str | None:
    """Why the pair gets no optimizer allowance (None when it gets one); `dtypes`: those modelled."""
    meta = {**a.meta, **b.meta}
    if meta.get("dtype") not in dtypes:
        return f"no per-element error model for dtype {meta.get('dtype')!r} ({' and '.join(dtypes)} only)"
    if optimizer_of(b.meta) is None and optimizer_of(a.meta) is None:
        return (f"optimizer settings not recorded ({missing(b.meta) or missing(a.meta)}): updates judged by how "
                f"far the gradients disagree, not by a replay of the optimizer; record them with "
                f"Recorder(..., optimizer=...) (docs/LIBRARY.md)")
    if registry.get(meta.get("strategy", ""), "oracle", "") not in registry.BY_NAME | {"": None}:  # own reference
        return (f"no optimizer replay for {meta['strategy']}: its recorded update is not the optimizer's step from the "
                f"recorded gradient (the replicas' mean, and an outer step every K): updates judged by how far "
                f"the gradients disagree")
    if a.first_step != 1 or b.first_step != 1:
        return ("no optimizer replay from a resumed trace (no optimizer state to replay from): updates judged by "
                "how far the gradients disagree")
    return None


def missing(meta: dict) -> str:
    """What a meta lacks for `optimizer_of`, in words ('' when nothing)."""
    name = meta.get("optimizer")
    lacks = [k for k in ("optimizer", "lr") if k not in meta]
    if name is not None and name not in OPTIMIZERS:
        return f"optimizer {name!r} is none of {', '.join(OPTIMIZERS)}"
    if "lr" in meta and not isinstance(meta["lr"], (int, float)):
        return f"lr {meta['lr']!r} is not a number"
    return "meta lacks " + " and ".join(repr(k) for k in lacks) if lacks else ""


def allowance(a, b, grad_bound: float = math.inf, elementwise_bound: float = math.inf) -> Allowance | None:
    """The error model of trace `a` against `b` (module docstring); None for a dtype it does not
    cover, and gradient floors only where the optimizer cannot be replayed (`why_none` says why)."""
    dtype = b.meta.get("dtype", a.meta.get("dtype"))
    if dtype not in MODELLED:
        return None
    opt = None if why_none(a, b, MODELLED) else optimizer_of(b.meta) or optimizer_of(a.meta)
    u = precision.unit(dtype, a.meta, b.meta)  # lower-precision sites' roundoff (precision census)
    out = Allowance(opt, grad_floor=grad_floors(b, u, grad_bound, elementwise_bound, a))
    if opt is None:
        return out
    names = [n for n in b.names() if f"init/{n}" in a.arrays]
    ua, ub = replay(a, opt, names, out.grads, "a"), replay(b, opt, names, out.grads, "b")
    total = {n: 0.0 for n in names}
    for k in sorted(set(ua) & set(ub)):
        for n in names:
            if n in ua[k] and n in ub[k]:
                with np.errstate(invalid="ignore", over="ignore"):
                    allow = np.abs(ua[k][n] - ub[k][n])
                allow = np.where(np.isfinite(allow), allow, 0.0)  # non-finite is judged elsewhere, never excused
                total[n] = total[n] + allow
                out.param[f"step/{k}/param/{n}"] = total[n]
                out.update[f"update/{k}/{n}"] = allow + storage(b, f"step/{k}/param/{n}")
    return out


def storage(t, key: str):
    """Each side rounds a parameter it stores to its dtype (half a unit in the last place): the two
    roundings of p_k differ by at most one ulp(p_k), which the update p_k - p_(k-1) carries (relative to
    the update, u |p| / |du|: 1.7e-4 for a LayerNorm scale of 1 moved by 7e-4 in float32). The
    parameter's own measure is relative to |p| and needs no such term."""
    p = t.arrays.get(key)
    return 0.0 if p is None else np.abs(np.spacing(np.asarray(p))).astype(np.float64)


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


def replay(t, opt: Optimizer, names, grads_out: dict | None = None, side: str = "",
           envelope: dict | None = None, weights: dict | None = None) -> dict:
    """{k: {name: update}}: each step's update as `opt` makes it from `t`'s own recorded gradients
    (before clipping) and parameters, in float64; stops at the first step missing a gradient.
    `envelope` receives {k: {name: M}}: the same update made from |g| and |p| (a running error
    bound's magnitude: the update's rounding in its dtype is a few u x M, also where its terms cancel);
    `weights` (Adam only) {k: {name: sqrt(v_hat) / (sqrt(v_hat) + eps)}}: how much of the update v sets."""
    state: dict = {}
    env_state: dict = {}
    out = {}
    for k, count, grads, params in recorded_steps.steps(t, names):
        if grads_out is not None:  # the recorded arrays themselves, not float64 copies
            grads_out.update({(side, k, n): t.arrays[f"step/{k}/grad/{n}"] for n in names})
        out[k] = _update(opt, grads, params, state, count)
        if envelope is not None:
            absolute = _update(opt, {n: np.abs(g) for n, g in grads.items()}, {n: np.abs(p) for n, p in params.items()},
                               env_state, count)
            envelope[k] = {n: np.abs(x) for n, x in absolute.items()}
        if weights is not None and opt.name in ("adam", "adamw"):
            weights[k] = {n: _v_weight(opt, state[n][1], count) for n in names}
    return out


def _update(opt: Optimizer, grads: dict, params: dict, state: dict, count: int) -> dict:
    """One step of `opt` (torch.optim's order: clip, coupled decay, the rule, decoupled decay)."""
    with np.errstate(all="ignore"):
        if opt.clip_norm > 0:
            coef = recorded_steps.clip_coefficient(opt.clip_norm, grads)
            grads = {n: g * coef for n, g in grads.items()}
        if opt.weight_decay and opt.name != "adamw":
            grads = {n: g + opt.weight_decay * params[n] for n, g in grads.items()}
        out = {}
        for n, g in grads.items():
            if opt.name == "sgd":
                out[n] = -opt.lr * g
            elif opt.name == "momentum":
                state[n] = g if n not in state else opt.momentum * state[n] + g
                out[n] = -opt.lr * state[n]
            else:
                out[n] = _adam(opt, g, params[n], state, n, count)
        return out


def _adam(opt: Optimizer, g, p, state: dict, n: str, count: int):
    b1, b2 = opt.betas
    m, v = state.get(n, (0.0, 0.0))
    m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
    state[n] = (m, v)
    u = -opt.lr * (m / (1 - b1 ** count)) / (np.sqrt(v / (1 - b2 ** count)) + opt.eps)
    return u - opt.lr * opt.weight_decay * p if opt.name == "adamw" else u


def _v_weight(opt: Optimizer, v, count: int):
    root = np.sqrt(v / (1 - opt.betas[1] ** count))
    return root / (root + opt.eps)


def excess(a, b, allow) -> np.ndarray:
    """|a - b| beyond the allowance, elementwise (NaN stays NaN: never agreement)."""
    d = np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))
    return d if allow is None else np.where(d > allow, d - allow, 0.0) + np.where(np.isnan(d), np.nan, 0.0)
