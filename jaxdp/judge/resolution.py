"""The judge's tight direction: how far two honest runs' updates can differ, derived per tensor and per
element from the two traces themselves, so that a bug far below the dtype's constant bound is seen
(docs/PARITY.md, "Bounds derived from the traces"). The dtype's constants stay as ceilings.

Two honest runs store p_k = p_(k-1) + U_k(g, p_(k-1)) + r_k, each with its own gradients g and its own
rounding r_k. The measured difference of one step's updates (du = p_k - p_(k-1), each side's own) is

    du_a - du_b = [U_k(g_a, p_a) - U_k(g_b, p_b)] + (arithmetic_a - arithmetic_b) + (r_a - r_b)

  1. the first term is replayed exactly (float64) from the recorded gradients and parameters
     (jaxdp/judge/error_model.py), signed: the only allowance an element gets from its gradients;
  2. the update arithmetic in the run's dtype (m, v, sqrt, the division, clipping's coefficient) errs
     by a few u of its running magnitude M_i (the same update made from |g| and |p|, which covers terms
     that cancel): C_ARITH u M_i;
  3. storing p_k: each side rounds at most twice at p's magnitude (torch's AdamW: the decay, then the
     step; optax: once), so |r_a - r_b| <= 2 ulp_i, ulp_i the spacing of the larger of p_k and p_(k-1);
  4. Adam's bias corrections 1 - beta^t: optax computes them in the run's dtype (float32 without x64:
     1 - 0.999 errs by 1.3e-5 relative, and beta's rounding grows with t), torch in float64, so a whole
     step's updates may differ in v's share (and in m's) by one factor common to every tensor, fitted as a
     median over the tensors weighted by how finely each one's storage resolves it (none above a third),
     and clamped to what that rounding can make (`common_scale`, `bias_limits`): a bug in one tensor is
     not common.

What is left, x_i = max(|du_a - du_b - (U_a - U_b)_i - s V_i| - C_ARITH u M_i - (m's and A's terms), 0)
(V: v's share of B's update; Adam with coupled decay also less C_SPLIT u T_i, jaxdp/judge/decay_split.py),
is storage only, and is judged
  per element  x_i <= 2 ulp_i                                   ('resolved element')
  per tensor   sum x_i^2 <= sum ulp_i^2 / 3 + 16 sqrt(sum ulp_i^4)  ('resolved update')
  along the update, per tensor over the steps so far: the signed residual's projection ('signed update',
  jaxdp/judge/signed.py: what a learning rate 1 + d on one tensor moves every element by, under one ulp each)
The tensor bound: each side's r is at most two roundings, each uniform in +-ulp/2 (variance ulp^2 / 12),
so E[x_i^2] <= ulp_i^2 / 3, and x_i^2 lies in [0, 4 ulp_i^2]; Hoeffding's inequality puts the sum
above its mean by 16 sqrt(sum ulp^4) (4 standard deviations of the bound, s = 4) with probability below
exp(-2 s^2) = 1e-14. Nothing here is a constant of the dtype: a tensor whose parameters are 0.02 and
whose update is 1e-3 resolves a change of its update of 1e-6 (float32) or 1e-14 (float64) relative;
one whose parameters are 1 (a LayerNorm scale) resolves ulp(1) / |du|. The smallest bug each tensor
shows is measured, not assumed (`python -m tests.mutations.limits`).

Applied where the optimizer can be replayed (error_model.why_none: float64 and float32, a named
optimizer, traces from step 1); elsewhere the constant bounds judge alone.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..core.traces import trace as trace_mod
from . import decay_split, error_model, signed

C_ARITH = 16  # unit roundoffs of the update's running magnitude (a handful of operations, with margin)
MEASURES = ("resolved update", "resolved element", signed.MEASURE)


@dataclass(frozen=True)
class Finding:
    """One tensor's update at one step, judged against its derived bound: `error` and `bound` are
    relative to the update (B's): the tensor's ||x|| / ||du_b||, or the element's x_i / |du_b,i|."""
    step: int
    name: str
    measure: str
    error: float
    bound: float
    index: tuple | None = None
    why: str = ""  # the element's: what the replay explains of |a - b| there, and the storage bound

    @property
    def ratio(self) -> float:
        if math.isnan(self.error):
            return math.inf
        return self.error / self.bound if self.bound > 0 else (math.inf if self.error > 0 else 0.0)

    def describe(self) -> str:
        at = f" at {list(self.index)}" if self.index is not None else ""
        if self.measure == signed.MEASURE:
            return (f"step {self.step}, update, {self.name}: {self.measure}: the residual along the update over the "
                    f"steps so far shows a scale {self.error:.2e} beyond its worst-case bias > {self.bound:.2e}, "
                    f"what storage rounding can make (a learning rate or scale on this tensor?)")
        return (f"step {self.step}, update, {self.name}{at}: {self.measure} error {self.error:.2e} > "
                f"{self.bound:.2e}, the storage roundoff left once the gradients' differences are replayed")


@dataclass
class Resolution:
    """Every (step, tensor) judged: `cells` holds both measures of each, `beyond` those past their bound."""
    opt: error_model.Optimizer
    cells: list = field(default_factory=list)
    beyond: list = field(default_factory=list)

    def worst(self, measure: str) -> Finding | None:
        return max((c for c in self.cells if c.measure == measure), key=lambda c: c.ratio, default=None)

    def failures(self) -> list[str]:
        """The judge's failure lines: the worst update beyond each derived bound."""
        out = []
        for measure in MEASURES:
            found = max((f for f in self.beyond if f.measure == measure), key=lambda f: f.ratio, default=None)
            if found is not None:
                out.append(f"{measure} {found.error:.2e} > {found.bound:.2e} at update/{found.step}/{found.name}")
        return out

    def flagged(self) -> set:
        """{(step, name)} of the updates beyond a derived bound."""
        return {(f.step, f.name) for f in self.beyond}


def resolve(a: trace_mod.Trace, b: trace_mod.Trace) -> Resolution | None:
    """The derived bounds of trace `a` against reference `b` (module docstring); None where the
    optimizer cannot be replayed (error_model.why_none says why)."""
    if error_model.why_none(a, b):
        return None
    opt = error_model.optimizer_of(b.meta) or error_model.optimizer_of(a.meta)
    u = error_model.UNIT[b.meta.get("dtype", a.meta.get("dtype"))]
    names = [n for n in b.names() if f"init/{n}" in a.arrays and f"init/{n}" in b.arrays]
    env_a, env_b, w_a, w_b = {}, {}, {}, {}
    ra = error_model.replay(a, opt, names, envelope=env_a, weights=w_a)
    rb = error_model.replay(b, opt, names, envelope=env_b, weights=w_b)
    split_a, split_b = (decay_split.envelope(t, opt, names) for t in (a, b))  # Adam's coupled decay, rounded apart
    out, running = Resolution(opt), {}
    for k in sorted(set(ra) & set(rb)):
        pairs = {n: (pa, pb) for n in names if (pa := _params(a, k, n)) is not None and (pb := _params(b, k, n))
                 is not None and n in ra[k] and n in rb[k] and np.shape(pa[1]) == np.shape(pb[1])}
        # (keys or shapes only one side has are the judge's to name: trace.diff)
        count = k - b.first_step + 1
        limit_m, limit_v = bias_limits(opt, count, u)
        adam = {n: _adam_part(opt, rb[k][n], pb[0]) for n, (_, pb) in pairs.items()}
        by_v = {n: adam[n] * w_b.get(k, {}).get(n, 0.0) for n in pairs}
        adam_a = {n: _adam_part(opt, ra[k][n], pa[0]) for n, (pa, _) in pairs.items()}
        by_v_a = {n: adam_a[n] * w_a.get(k, {}).get(n, 0.0) for n in pairs}
        replayed = {n: ra[k][n] - rb[k][n] for n in pairs}
        residual = {n: _du(*pa) - _du(*pb) - replayed[n] for n, (pa, pb) in pairs.items()}
        ulps = {n: _ulp(*pa, *pb) for n, (pa, pb) in pairs.items()}
        s_v = common_scale(limit_v, residual, by_v, ulps)  # v's correction first (the larger), then m's on what is left
        s_m = common_scale(limit_m, {n: r - (s_v or 0.0) * by_v[n] for n, r in residual.items()}, adam, ulps)
        for n, (pa, pb) in pairs.items():
            # each factor is fitted on B's updates; where A's differ (elements the replay already explains),
            # it may sit on A's side instead: its limit times the difference. No fit (fewer than 3 tensors):
            # its limit per element.
            loose = [(limit, b if s is None else a - b) for limit, s, a, b in
                     ((limit_v, s_v, by_v_a[n], by_v[n]), (limit_m, s_m, adam_a[n], adam[n]))]
            noise = C_ARITH * u * np.maximum(env_a[k][n], env_b[k][n]) + sum(lim * np.abs(x) for lim, x in loose)
            noise = noise + decay_split.C_SPLIT * u * np.maximum(split_a.get(k, {}).get(n, 0.0),
                                                                 split_b.get(k, {}).get(n, 0.0))
            expected = replayed[n] + (s_v or 0.0) * by_v[n] + (s_m or 0.0) * adam[n]
            found = judge_tensor(pa, pb, expected, noise, k, n)
            sums = running.setdefault(n, signed.Running())
            sums.add(_du(*pa) - _du(*pb) - expected, noise, _ulp(*pa, *pb), _du(*pb))
            found.append(Finding(k, n, signed.MEASURE, *sums.judged()))
            out.cells += found
            out.beyond += [f for f in found if f.ratio > 1]
    return out


def _du(before, after) -> np.ndarray:
    return after.astype(np.float64) - before.astype(np.float64)


def _adam_part(opt, update, before) -> np.ndarray:
    """The part of a replayed update that Adam's bias corrections scale: all of it but AdamW's decoupled decay."""
    if opt.name == "adamw":
        return update + opt.lr * opt.weight_decay * before.astype(np.float64)
    return update


def bias_limits(opt, count: int, u: float) -> tuple[float, float]:
    """How far rounding can move Adam's two bias corrections 1 - beta^t, relative (0 for sgd and momentum):
    optax computes them in the run's dtype (float32 without x64: 1 - 0.999 errs by 1.3e-5, and beta's own
    rounding grows t-fold in beta^t), torch in float64; both sides' errors, 2 u (t + 1) beta^t / (1 - beta^t)
    + 4 u: m's (float32: 2.2e-6 at step 1, 1.1e-6 at step 4) and v's (halved by the square root: 1.2e-4
    at step 1, 7.5e-5 at step 4, 6e-5 at step 20), each as one factor common to the tensors (`common_scale`)."""
    if opt.name not in ("adam", "adamw"):
        return 0.0, 0.0
    b1, b2 = opt.betas
    return (2 * u * (count + 1) * b1 ** count / (1 - b1 ** count) + 4 * u,
            u * (count + 1) * b2 ** count / (1 - b2 ** count) + 4 * u)


def common_scale(limit: float, residual: dict, by_v: dict, ulps: dict) -> float | None:
    """The factor s by which v's bias correction moved every tensor's Adam update on one side: the update's
    part set by v, A sqrt(v_hat) / (sqrt(v_hat) + eps), times s. Fitted as a weighted median over the tensors
    of each one's least-squares factor (3 tensors at least, else None), clamped to `limit` (`bias_limits`);
    0 for sgd and momentum. Each tensor weighs by how well its storage roundoff (`ulps`, per element) lets it
    resolve the factor, 1 / its factor's variance, capped at a third of the total, so that no tensor alone
    (a bug in one tensor moves its own factor) sets the median. Unweighted, the median followed noise: in
    float64, a BatchNorm scale near 1 resolves its update to 2e-13 relative and a bias near 2e-3 to 4e-16,
    and a median of 3e-15 set by the noisy half moved the biases' expected updates by 7 of their ulps
    (docs/PARITY.md, "the cnn's false alarm")."""
    if limit == 0:
        return 0.0
    factors, weights = [], []
    for n, a in by_v.items():
        energy = float(np.sum(a * a))
        if energy > 0 and np.isfinite(energy) and np.isfinite(residual[n]).all():
            factors.append(float(np.sum(residual[n] * a)) / energy)
            noise = float(np.sum(a * a * ulps[n] ** 2))
            weights.append(energy * energy / noise if noise > 0 else math.inf)  # 0 (underflow): exact; inf: capped
    if len(factors) < 3:
        return None
    weights = capped(np.asarray(weights), 1 / 3)
    order = np.argsort(factors)
    cumulative = np.cumsum(weights[order])
    median = float(np.asarray(factors)[order][int(np.searchsorted(cumulative, cumulative[-1] / 2))])
    return float(np.clip(median, -limit, limit))


def capped(weights: np.ndarray, share: float) -> np.ndarray:
    """`weights` with none above `share` of the new total: the largest cut to the one level c at which the k
    cut ones and the rest satisfy c = share (k c + rest)."""
    w = np.where(np.isnan(weights), 0.0, weights).astype(np.float64)
    finite = float(np.sum(w[np.isfinite(w)]))
    w = np.where(np.isinf(w), 10 * finite + 1, w)  # past any level c the others can set (c <= their sum)
    if not np.sum(w) > 0 or not np.isfinite(np.sum(w)):
        return np.ones_like(w)
    desc = np.sort(w)[::-1]
    for k in range(len(w)):
        rest = float(np.sum(desc[k:]))
        if k == 0:
            if desc[0] <= share * rest:
                return w
            continue
        if share * k < 1 and desc[k - 1] >= (c := share * rest / (1 - share * k)) >= desc[k]:
            return np.minimum(w, c)
    return np.ones_like(w)  # no level: every tensor alike


def _ulp(a0, a1, b0, b1) -> np.ndarray:
    """Per element, the spacing of the largest of a tensor's four stored parameters (both sides, both steps)."""
    return np.maximum.reduce([np.spacing(np.abs(v)).astype(np.float64) for v in (a0, a1, b0, b1)])


def _params(t, k: int, name: str):
    """(p_(k-1), p_k) of `t` in their stored dtype, or None."""
    before = t.arrays.get(f"init/{name}" if k == t.first_step else f"step/{k - 1}/param/{name}")
    after = t.arrays.get(f"step/{k}/param/{name}")
    return None if before is None or after is None else (np.asarray(before), np.asarray(after))


def judge_tensor(pa, pb, expected, noise, step: int, name: str) -> list[Finding]:
    """Both measures of one tensor's update at one step: `pa`, `pb` each side's (p_(k-1), p_k);
    `expected` the signed difference du_a - du_b the replay (and the step's common factor) explains,
    `noise` what the update arithmetic may add, per element."""
    (a0, a1), (b0, b1) = pa, pb
    du_a, du_b = _du(a0, a1), _du(b0, b1)
    with np.errstate(invalid="ignore", over="ignore"):
        replayed = np.abs(np.nan_to_num(expected, nan=0.0, posinf=0.0, neginf=0.0)) + np.zeros(np.shape(a1))
        arithmetic = np.nan_to_num(noise, nan=0.0, posinf=0.0) + np.zeros(np.shape(a1))
        x = np.maximum(np.abs(du_a - du_b - np.nan_to_num(expected, nan=0.0, posinf=0.0, neginf=0.0))
                       - np.nan_to_num(noise, nan=0.0, posinf=0.0), 0.0)
        x = np.where(np.isfinite(du_a) & np.isfinite(du_b), x, np.nan)
    ulp = _ulp(a0, a1, b0, b1)
    if not x.size:
        return []
    scale = float(np.linalg.norm(du_b)) or 1.0
    bound2 = float(np.sum(ulp ** 2)) / 3 + 16 * math.sqrt(float(np.sum(ulp ** 4)))
    tensor = Finding(step, name, "resolved update", float(np.linalg.norm(x)) / scale, math.sqrt(bound2) / scale)
    if np.isnan(x).any():
        return [tensor, Finding(step, name, "resolved element", math.nan, 0.0, _at(np.isnan(x)))]
    i = np.unravel_index(int(np.argmax(x / (2 * ulp))), x.shape)
    size = float(abs(du_b[i])) or 1.0
    why = (f"|A - B| {abs(du_a[i] - du_b[i]):.1e} in this element's update, of which "
           + (f"the replay (both sides' own gradients and parameters, the step's common factor) explains "
              f"{float(replayed[i]):.1e} and "
              if replayed[i] > 0 else "the replay explains nothing (both sides' gradients and parameters give the "
              "same update) and ")
           + f"the update's arithmetic {float(arithmetic[i]):.1e}; storage roundoff allows "
           f"{2 * float(ulp[i]):.1e} more")
    element = Finding(step, name, "resolved element", float(x[i]) / size, 2 * float(ulp[i]) / size,
                      tuple(int(j) for j in i), why)
    return [tensor, element]


def _at(mask) -> tuple:
    return tuple(int(j) for j in np.unravel_index(int(np.argmax(mask)), mask.shape))
