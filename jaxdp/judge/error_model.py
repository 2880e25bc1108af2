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

Applied to float64, float32 and bf16 runs (bf16's floor constant and its loss term:
jaxdp/judge/bf16_floor.py). A resumed trace (no optimizer state to replay from) or an
optimizer meta does not name gets the gradient floors and the gradient-explained allowances of
jaxdp/judge/unmodelled.py instead of a replay, which the notes say.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..core.registry import strategies as registry
from ..core.traces.trace import errors
from . import bf16_floor, precision, recorded_steps
from .floors import C_GRAD, K_PROP, GradFloor, disagreement, grad_floors, propagated  # noqa: F401 (error_model.<name>)

OPTIMIZERS = ("sgd", "momentum", "adam", "adamw")
DTYPES = ("float64", "float32")  # the derived bounds' (resolution.py)
MODELLED = DTYPES + (bf16_floor.DTYPE,)  # the allowances' (bfloat16: jaxdp/judge/bf16_floor.py)
UNIT = {"float64": 2.0 ** -53, "float32": 2.0 ** -24}  # unit roundoff u


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
    if dtype == bf16_floor.DTYPE:
        out = Allowance(opt, grad_floor=bf16_floor.grad_floors(a, b, u, grad_bound, elementwise_bound))
    else:
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
    if dtype == bf16_floor.DTYPE:
        bf16_floor.loss(a, b, out)
    return out


def storage(t, key: str):
    """Each side rounds a parameter it stores to its dtype (half a unit in the last place): the two
    roundings of p_k differ by at most one ulp(p_k), which the update p_k - p_(k-1) carries (relative to
    the update, u |p| / |du|: 1.7e-4 for a LayerNorm scale of 1 moved by 7e-4 in float32). The
    parameter's own measure is relative to |p| and needs no such term."""
    p = t.arrays.get(key)
    return 0.0 if p is None else np.abs(np.spacing(np.asarray(p))).astype(np.float64)


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
