"""What the judge says when its error model (jaxdp/judge/error_model.py) kept a tensor within its bound:
each relaxed tensor with its most relaxed element, that element's gradients against the tensor's
scale, the allowance and the measured difference (`jaxdp diff`'s "within bounds by the error model"
lines, `--json`'s "relaxed", the first divergence's allowance)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..core.traces.trace import TraceDiff, parse_key
from . import error_model
from .error_model import Allowance, Optimizer


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
    stored: float = 0.0  # the allowance's storage part (one ulp of the parameter), the rest the replay's

    def describe(self, opt: Optimizer | None, sides=("a", "b")) -> str:
        return (f"step {self.step}, {self.field}, {self.name} at {list(self.index)}: {self.measure} error "
                f"{self.raw:.2e} > {self.bound:g}, {self.judged:.2e} beyond the allowance; "
                + why(opt, self.grad_a, self.grad_b, self.tensor_max, self.allowance, self.measured, sides,
                    self.stored))


def why(opt: Optimizer | None, g_a: float, g_b: float, tensor_max: float, allow: float, measured: float,
        sides=("a", "b"), stored: float = 0.0) -> str:
    """The error model's reason for one element's allowance, in words, and only the true one: `allow` is the
    replayed difference of the two sides' updates (their own gradients and parameters through the optimizer)
    plus `stored`, the storage rounding (one ulp of the parameter; 0 for a parameter's own measure). Where
    the replay gives both sides the same update (gradients equal bitwise, say) nothing is said to come from
    the gradients: the allowance is named for what it is, the storage rounding."""
    replayed = max(allow - stored, 0.0)
    ratio = abs(g_b) / tensor_max if tensor_max > 0 else math.inf
    grads = (f"gradient {g_b:.1e} on both sides (bitwise equal)" if g_a == g_b else
             f"gradient {g_b:.1e} ({sides[1]}) and {g_a:.1e} ({sides[0]})")
    grads += f" against the tensor's max {tensor_max:.1e} ({ratio:.0e} of it)"
    tail = f"allowance {allow:.1e} for this element, |{sides[0]} - {sides[1]}| {measured:.1e}"
    if replayed <= 0:
        what = (f"the optimizer ({opt.describe()}) replayed on each side's gradients and parameters gives this "
                f"element the same update" if opt else "the two sides' gradients give this element no difference")
        store = f"one ulp of the stored parameter (each side rounds it to its dtype), {stored:.1e}" if stored > 0 \
            else "nothing"
        return f"{grads}: {what}, so nothing is allowed from the gradients; allowed: {store}; {tail}"
    name = opt.name if opt else ""
    how = ("which Adam's m / (sqrt(v) + eps) amplifies" if name in ("adam", "adamw")
           else "which the update carries linearly" if opt else
           "which any optimizer may carry (no optimizer recorded: up to 2x the gradients' relative difference "
           "times the update)")
    after = f" after {opt.describe()}" if opt else ""
    source = " (equal at this step: from earlier steps' gradients or the parameters)" if g_a == g_b else ""
    store = f", plus one ulp of storage {stored:.1e}" if stored > 0 else ""
    return (f"{grads}: the two sides' own gradients and parameters{after} make this element's updates differ by "
            f"{replayed:.1e}{source}, a difference {how}{store}; {tail}")


@dataclass
class GradRelaxed:
    """A gradient whose raw error was beyond its bound, within it at the step's roundoff scale."""
    step: int
    name: str
    measure: str
    raw: float
    judged: float
    bound: float
    norm: float  # ||g_t||
    step_norm: float  # ||g_step||
    floor: float
    rho: float = 0.0  # the parameters' disagreement entering the step, where it set the floor
    field: str = "grad"

    def describe(self, opt=None, sides=("a", "b")) -> str:
        head = f"step {self.step}, grad, {self.name}: {self.measure} error {self.raw:.2e} > {self.bound:g}, "
        if self.rho:
            return head + (f"{self.judged:.2e} against what the parameters' accepted disagreement entering the step "
                           f"({self.rho:.1e} of its update) moves the gradients by (docs/PARITY.md), floor "
                           f"{self.floor:.1e}")
        return head + (f"{self.judged:.2e} at the step's roundoff scale; gradient norm {self.norm:.1e} against the "
                       f"step's {self.step_norm:.1e}: roundoff only (a sum whose terms cancel, as a bias before a "
                       f"normalisation), judged against the floor {self.floor:.1e}")


def relaxations(a, b, allow: Allowance, diff: TraceDiff, tol, floor: float) -> list[Relaxed]:
    """The parameters and updates whose raw error is beyond `tol` but whose error beyond the allowances
    (in `diff`, trace.diff's result: its `raw` errors and the judged ones) is not: each with its most
    relaxed element."""
    out = []
    ua, ub = diff.updates
    for key, A in list(allow.param.items()) + list(allow.update.items()):
        parsed = parse_key(key)  # step/<k>/param/<name> or update/<k>/<name>
        step, name, field_name = parsed.step, parsed.name, "update" if parsed.kind == "update" else "param"
        raw_norm, raw_elem = diff.raw.get(key, (0.0, None))
        checks = [("norm", raw_norm, diff.norm.get(key, 0.0), tol.bound(field_name))]
        if field_name == "param":
            checks.append(("elementwise", raw_elem, diff.elementwise.get(key, 0.0), tol.elementwise))
        for measure, raw, judged, bound in checks:
            if raw > bound >= judged:
                xa, xb = (ua.get(key), ub.get(key)) if field_name == "update" else (a.arrays[key], b.arrays[key])
                out.append(_relaxed(key, step, field_name, name, measure, raw, judged, bound, xa, xb, A, allow, b))
                break
    out += _grads(a, b, allow, diff, tol, floor)
    return sorted(out, key=lambda r: (r.step, r.field, r.name))


def _relaxed(key, step, field_name, name, measure, raw, judged, bound, xa, xb, A, allow, b) -> Relaxed:
    d = np.abs(np.asarray(xa, np.float64) - np.asarray(xb, np.float64))
    index = np.unravel_index(int(np.argmax(np.minimum(d, A))), d.shape) if d.ndim else ()
    g_a, g_b = (allow.grads.get((s, step, name)) for s in ("a", "b"))
    g_b = np.zeros_like(d) if g_b is None else g_b
    g_a = g_b if g_a is None else g_a
    stored = error_model.storage(b, f"step/{step}/param/{name}") if field_name == "update" else 0.0
    return Relaxed(key, step, field_name, name, measure, raw, judged, bound, tuple(int(i) for i in index),
                   float(g_a[index]), float(g_b[index]), float(np.max(np.abs(g_b))) if g_b.size else 0.0,
                   float(A[index]), float(d[index]), float(np.broadcast_to(stored, d.shape)[index]))


def _grads(a, b, allow: Allowance, diff: TraceDiff, tol, floor: float) -> list[GradRelaxed]:
    out = []
    for key, (norm_floor, elem_floor, step_norm, rho) in allow.grad_floor.items():
        raw_norm, raw_elem = diff.raw.get(key, (0.0, 0.0))
        checks = [("norm", raw_norm, diff.norm.get(key, 0.0), tol.grad, norm_floor),
                  ("elementwise", raw_elem, diff.elementwise.get(key, 0.0), tol.elementwise, elem_floor)]
        for measure, raw, judged, bound, at in checks:
            if raw > bound >= judged:
                parsed = parse_key(key)  # step/<k>/grad/<name>
                out.append(GradRelaxed(parsed.step, parsed.name, measure, raw, judged, bound,
                                       float(np.linalg.norm(np.asarray(b.arrays[key], np.float64))), step_norm, at,
                                       rho))
                break
    return out


def lines(row, sides=("A", "B")) -> tuple[str, list[str]]:
    """A judged row's note on its error model (which optimizer it replayed, or why none) and one line
    per tensor it relaxed."""
    opt = row.allowance.opt if row.allowance else None
    note = row.model_note or (f"error model: updates and parameters judged beyond what the gradients' "
                              f"differences become after {opt.describe()} (docs/PARITY.md)")
    return note, [r.describe(opt, sides) for r in row.relaxed]
