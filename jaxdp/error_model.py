"""The error model behind the judge's update and parameter measures: how far apart two honest runs'
updates may be, element by element, given the gradients they recorded (docs/PARITY.md, "The error
model per element").

Two honest runs compute the same gradients in different summation orders. The judge bounds that
difference where it arises, on the gradients (the `grad` bound). An optimizer is a function U of the
gradients so far and the parameters, and what the gradient check accepts must be accepted after U too,
and no more:

    du_a - du_b = [U(g_a, p_a) - U(g_b, p_b)] + (r_a - r_b)

where r is each run's own rounding of the update arithmetic (a few unit roundoffs of |du|: what the
update bounds were derived for). The first term is computed here, exactly (float64), by replaying the
run's nominal optimizer (meta `optimizer`, `lr`, `weight_decay`, `clip_norm`; Adam's betas and eps,
SGD's momentum: torch's defaults unless meta gives `adam_betas`, `adam_eps`, `momentum`) on each
trace's own recorded gradients and parameters. Its magnitude is each element's **allowance**:
    update/<k>/<name>      A_k = |U_k(g_a, p_a) - U_k(g_b, p_b)|
    step/<k>/param/<name>  the sum of A_j over j <= k    (p_k = init + the sum of the updates)
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

Applied to float64 and float32 runs that start at step 1 with a known optimizer; bf16 runs keep their
bounds (Adam's updates there are judged per step, which already absorbs such elements); a resumed trace
(no optimizer state to replay from) or an unknown optimizer gets no allowance, which the notes say.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .trace import errors, updates

CLIP_EPS = 1e-6  # torch.nn.utils.clip_grad_norm_'s: coef = max_norm / (norm + 1e-6)
OPTIMIZERS = ("sgd", "momentum", "adam", "adamw")
DTYPES = ("float64", "float32")


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
    """Per-element allowances (key -> array, float64) and what they were computed from."""
    opt: Optimizer
    update: dict = field(default_factory=dict)  # update/<k>/<name>
    param: dict = field(default_factory=dict)  # step/<k>/param/<name>
    grads: dict = field(default_factory=dict)  # (side, k, name) -> recorded gradient (float64), for explanations

    def of(self, key: str):
        return self.update.get(key, self.param.get(key))


def why_none(a, b) -> str | None:
    """Why the pair gets no allowance (None when it gets one)."""
    meta = {**a.meta, **b.meta}
    if meta.get("dtype") not in DTYPES:
        return f"no per-element error model for dtype {meta.get('dtype')!r} (float64 and float32 only)"
    if optimizer_of(b.meta) is None and optimizer_of(a.meta) is None:
        return "no per-element error model: meta names no optimizer (sgd, momentum, adam, adamw) with its lr"
    if a.first_step != 1 or b.first_step != 1:
        return "no per-element error model: a resumed trace has no optimizer state to replay"
    return None


def allowance(a, b) -> Allowance | None:
    """The allowances of trace `a` against `b` (module docstring), or None (`why_none` says why)."""
    if why_none(a, b) is not None:
        return None
    opt = optimizer_of(b.meta) or optimizer_of(a.meta)
    names = [n for n in b.names() if f"init/{n}" in a.arrays]
    out = Allowance(opt)
    ua, ub = replay(a, opt, names, out.grads, "a"), replay(b, opt, names, out.grads, "b")
    total = {n: 0.0 for n in names}
    for k in sorted(set(ua) & set(ub)):
        for n in names:
            if n in ua[k] and n in ub[k]:
                allow = np.abs(ua[k][n] - ub[k][n])
                allow = np.where(np.isfinite(allow), allow, 0.0)  # non-finite is judged elsewhere, never excused
                total[n] = total[n] + allow
                out.update[f"update/{k}/{n}"], out.param[f"step/{k}/param/{n}"] = allow, total[n]
    return out


def replay(t, opt: Optimizer, names, grads_out: dict | None = None, side: str = "") -> dict:
    """{k: {name: update}}: each step's update as `opt` makes it from `t`'s own recorded gradients
    (before clipping) and parameters, in float64; stops at the first step missing a gradient."""
    state: dict = {}
    out = {}
    params = {n: np.asarray(t.arrays[f"init/{n}"], np.float64) for n in names}
    for k in range(t.first_step, t.steps + 1):
        keys = {n: f"step/{k}/grad/{n}" for n in names}
        if not all(key in t.arrays for key in keys.values()):
            break
        grads = {n: np.asarray(t.arrays[key], np.float64) for n, key in keys.items()}
        if grads_out is not None:
            grads_out.update({(side, k, n): g for n, g in grads.items()})
        out[k] = _update(opt, grads, params, state, k - t.first_step + 1)
        params = {n: np.asarray(t.arrays.get(f"step/{k}/param/{n}", params[n]), np.float64) for n in names}
    return out


def _update(opt: Optimizer, grads: dict, params: dict, state: dict, count: int) -> dict:
    """One step of `opt` (torch.optim's order: clip, coupled decay, the rule, decoupled decay)."""
    with np.errstate(all="ignore"):
        if opt.clip_norm > 0:
            norm = math.sqrt(sum(float(np.sum(g * g)) for g in grads.values()))
            coef = min(opt.clip_norm / (norm + CLIP_EPS), 1.0)
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


def excess(a, b, allow) -> np.ndarray:
    """|a - b| beyond the allowance, elementwise (NaN stays NaN: never agreement)."""
    d = np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))
    return d if allow is None else np.where(d > allow, d - allow, 0.0) + np.where(np.isnan(d), np.nan, 0.0)


@dataclass
class Relaxed:
    """A parameter or update that the allowances kept within its bound: its raw error was beyond."""
    key: str
    step: int
    field: str  # "update" or "param"
    name: str
    measure: str  # "norm" or "elementwise"
    raw: float
    judged: float
    bound: float
    index: tuple
    grad_a: float
    grad_b: float
    tensor_max: float
    allowance: float
    measured: float

    def describe(self, opt: Optimizer, sides=("a", "b")) -> str:
        return (f"step {self.step}, {self.field}, {self.name} at {list(self.index)}: {self.measure} error "
                f"{self.raw:.2e} > {self.bound:g} raw, {self.judged:.2e} beyond the allowance; "
                + why(opt, self.grad_a, self.grad_b, self.tensor_max, self.allowance, self.measured, sides))


def why(opt: Optimizer, g_a: float, g_b: float, tensor_max: float, allow: float, measured: float,
        sides=("a", "b")) -> str:
    """The error model's reason for one element's allowance, in words."""
    ratio = abs(g_b) / tensor_max if tensor_max > 0 else math.inf
    level = "roundoff level" if ratio < 1e-6 else "small" if ratio < 1e-3 else "resolved"
    how = ("that Adam's m / (sqrt(v) + eps) amplifies" if opt.name in ("adam", "adamw")
           else "that the update carries linearly")
    return (f"gradient {g_b:.1e} ({sides[1]}) and {g_a:.1e} ({sides[0]}) against the tensor's max "
            f"{tensor_max:.1e} ({level}): a difference {how} ({opt.describe()}); allowance {allow:.1e} "
            f"for this element, measured {measured:.1e}")


def relaxations(a, b, allow: Allowance, diff: dict, tol, floor: float) -> list[Relaxed]:
    """The parameters and updates whose raw error is beyond `tol` but whose error beyond the allowances
    (in `diff`, trace.diff's result) is not: each with its most relaxed element."""
    out, ua, ub = [], None, None
    for key, A in list(allow.param.items()) + list(allow.update.items()):
        field_name = "update" if key.startswith("update/") else "param"
        step, name = int(key.split("/")[1]), key.split("/", 3)[-1] if field_name == "param" else key.split("/", 2)[2]
        if field_name == "update":
            ua, ub = ua or updates(a), ub or updates(b)
            xa, xb = ua.get(key), ub.get(key)
        else:
            xa, xb = a.arrays.get(key), b.arrays.get(key)
        if xa is None or xb is None or not A.size or float(A.max()) == 0.0:
            continue
        judged_norm, judged_elem = diff["norm"].get(key, 0.0), diff["elementwise"].get(key, 0.0)
        _, raw_norm, raw_elem = errors(xa, xb, floor)
        checks = [("norm", raw_norm, judged_norm, tol.bound(field_name))]
        if field_name == "param":
            checks.append(("elementwise", raw_elem, judged_elem, tol.elementwise))
        for measure, raw, judged, bound in checks:
            if raw > bound >= judged:
                out.append(_relaxed(key, step, field_name, name, measure, raw, judged, bound, xa, xb, A, allow))
                break
    return sorted(out, key=lambda r: (r.step, r.field, r.name))


def _relaxed(key, step, field_name, name, measure, raw, judged, bound, xa, xb, A, allow) -> Relaxed:
    d = np.abs(np.asarray(xa, np.float64) - np.asarray(xb, np.float64))
    index = np.unravel_index(int(np.argmax(np.minimum(d, A))), d.shape) if d.ndim else ()
    g_a, g_b = (allow.grads.get((s, step, name)) for s in ("a", "b"))
    g_b = np.zeros_like(d) if g_b is None else g_b
    g_a = g_b if g_a is None else g_a
    return Relaxed(key, step, field_name, name, measure, raw, judged, bound, tuple(int(i) for i in index),
                   float(g_a[index]), float(g_b[index]), float(np.max(np.abs(g_b))) if g_b.size else 0.0,
                   float(A[index]), float(d[index]))
