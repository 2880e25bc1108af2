"""Cross-framework parity: the same configuration trained by jaxdp and by torch_ref gives the same
losses, gradients and parameters, strategy by strategy; and the one judge (`judge`) that every
trace comparison of the project uses: `jaxdp parity`, `jaxdp diff` (through `jaxdp.judge.divergence`, which
localises its verdict), `compare`'s report, the strategy tests (a strategy against `single`) and the
mutation tests.

`check(cfg, pairs)` trains every pair (JAX in this process, torch in one spawned world per device
count, running all its configurations), judges the two traces step by step, and returns one row per
pair; `format_table` prints them.

What is measured (`jaxdp.core.traces.trace.diff`), per step k and per tensor (array) t:
  loss         |a - b| / |b|
  grad, param  ||a - b|| / ||b||                              (2-norm over the tensor)
  update       ||du_a - du_b|| / ||du_b||,  du = param_k - param_(k-1)  (one step's update, not an
               accumulated error: every step is judged on its own, the last included)
  step update  the same over all tensors of step k at once
  elementwise  max_i |a_i - b_i| / max(|b_i|, floor)          (float64 only; floor 1e-12)
and, always: any NaN or Inf in either trace is a failure named by key (non-finite is never
agreement); the initial parameters must be bit-identical; and in bf16 runs on N > 1 devices the
gradients must not all be bfloat16 values (see `bf16_reduced`), and each step's gradients keep their scale along
the reference's (jaxdp/judge/bf16_floor.py); and the ranks agree (jaxdp/core/traces/spread.py).

The constant bounds (`TOLERANCES`; their derivation and measurements: docs/PARITY.md) sit below the
smallest whole-step bug (a factor: negated 2, skipped 1, halved 0.5, a missing 1/N) and above honest
roundoff with margin: float64 ~1e-15 honest, bound 1e-12 (updates 1e-10: read from stored parameters);
float32 ~1e-7 honest, bound 1e-5 (updates 1e-4); bf16 0.25 (8-bit rounding at different ops; Adam's
updates per step). They are ceilings: every update is also judged against the bound derived from the
two traces (jaxdp/judge/resolution.py: its storage roundoff once the gradients' differences are
replayed), which catches a 1e-6 (float32) or 1e-14 (float64) change of a weight's update.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from ..core.registry import strategies as registry
from ..core.run.config import RunConfig
from ..core.traces import trace as trace_mod
from . import bf16_floor, error_model, precision, relaxed, resolution, unmodelled

# (label, jaxdp strategy, torch_ref strategy): same names where both frameworks have them (the registry rows
# with `parity`), and the
# two framework-only variants against the other side's plain ddp.
REPLICATED = registry.REPLICATED
ONE_SIDED = {e.name: (f"{e.name}/{REPLICATED}", e.name, REPLICATED) if e.jax else (f"{REPLICATED}/{e.name}", REPLICATED,
                                                                                  e.name)
             for e in registry.ENTRIES if not e.twin and bool(e.jax) != bool(e.torch)}  # ddp-pmap, ddp-naive
PAIRS = [(s, s, s) for s in registry.names(parity=True)] + list(ONE_SIDED.values())
PAIR_BY_LABEL = {label: (j, t) for label, j, t in PAIRS}
FIELDS = ("loss", "grad", "param", "update", "step update")
ADAM = ("adam", "adamw")


def pairs_for(names) -> list[tuple[str, str, str]]:
    """Pairs for strategy names: a name both sides have, or 'jax~torch' (e.g. ddp-pmap~ddp)."""
    out = []
    for name in names:
        if "~" in name:
            j, t = name.split("~")
            out.append((f"{j}/{t}", j, t))
        elif name in ONE_SIDED:
            out.append(ONE_SIDED[name])
        else:
            out.append((name, name, name))
    return out


@dataclass(frozen=True)
class Tolerance:
    """Bounds on the measures of the module docstring (inf: not judged)."""
    loss: float
    grad: float
    param: float
    update: float
    step_update: float
    elementwise: float = math.inf
    why: str = ""

    def bound(self, field_name: str) -> float:
        return getattr(self, field_name.replace(" ", "_"))


INF = math.inf
# (dtype, optimizer family) -> bounds; the derivation is the module docstring's.
TOLERANCES = {
    ("float64", "sgd"): Tolerance(1e-12, 1e-12, 1e-12, 1e-10, 1e-10, 1e-6,
                                  "float64: same sums, different orders: ~1e-15"),
    ("float32", "sgd"): Tolerance(1e-5, 1e-5, 1e-5, 1e-4, 1e-4,
                                  why="float32: reordered sums, ~150 unit roundoffs; updates per step 1e-4"),
    ("float32", "adam"): Tolerance(1e-5, 1e-5, 1e-5, 1e-4, 1e-4,
                                   why="float32: reordered sums; Adam's per-tensor update error measured <= 5e-6"),
    ("bfloat16", "sgd"): Tolerance(1e-2, 0.25, 0.25, 0.25, 0.25,
                                   why="bf16: 8-bit rounding at different ops; a factor 2 (error >= 0.5) fails"),
    ("bfloat16", "adam"): Tolerance(1e-2, 0.25, INF, INF, 0.25,
                                    why="bf16: Adam's near-zero elements flip sign: its updates judged per step"),
}
TOLERANCES[("float64", "adam")] = TOLERANCES[("float64", "sgd")]


def tolerance(cfg) -> Tolerance:
    """The bounds for a run: `cfg` is a RunConfig or a trace's meta (dtype and optimizer)."""
    get = cfg.get if isinstance(cfg, dict) else lambda k, d=None: getattr(cfg, k, d)
    dtype, optimizer = get("dtype", "float64"), get("optimizer", "sgd")
    if dtype not in ("float64", "float32", "bfloat16"):
        raise trace_mod.TraceError(f"no tolerances for dtype {dtype!r} (meta 'dtype'); pass --tolerance")
    family = "adam" if optimizer in ADAM else "sgd"  # a precision census's lower sites: jaxdp/judge/precision.py
    return precision.bounds(TOLERANCES[(dtype, family)], get(precision.KEY), TOLERANCES, family)


@dataclass
class Row:
    """The judgement of trace a against reference b."""
    label: str
    cfg: RunConfig | None
    worst: dict  # field -> worst error over all steps
    per_step: dict  # field -> [worst error at step k]
    worst_key: dict  # field -> the array (key) of the worst error
    init_identical: bool
    tol: Tolerance
    failures: list = field(default_factory=list)
    diff: trace_mod.TraceDiff | None = field(default=None, repr=False)  # trace.diff's result
    allowance: error_model.Allowance | None = field(default=None, repr=False)  # the per-element error model
    relaxed: list = field(default_factory=list)  # jaxdp.judge.relaxed: kept within bounds by the error model
    model_note: str = ""  # why the error model replayed no optimizer ("" when it did)
    resolution: resolution.Resolution | None = field(default=None, repr=False)  # the derived bounds

    @property
    def ok(self) -> bool:
        return not self.failures


def judge(a, b, tol: Tolerance | None = None, label: str = "", cfg: RunConfig | None = None,
          sides=("a", "b"), check_config: bool = True, with_ulp: bool = False) -> Row:
    """Judge trace `a` against reference `b` with `tol` (default: `tolerance`, of B's meta and the censuses). A failure
    names the field, the worst array (by key) and the bound; non-finite arrays are named by key and side.
    The error model (jaxdp/judge/error_model.py) only lowers measures: it runs where they fail without it."""
    tol = tol or tolerance(precision.judged_meta(a, b))
    if check_config:
        trace_mod.check_comparable(a, b)
    derived = resolution.resolve(a, b)  # the tight direction: bounds derived from the traces
    row = _judged(a, b, tol, label, cfg, sides, with_ulp, None, derived)
    if row.ok or all(f.startswith(resolution.MEASURES) for f in row.failures):
        row.model_note = ("error model: not needed (every measure within its bound without it)" if row.ok else
                          "error model: not applied (only the bounds derived from the traces fail: docs/PARITY.md)")
        return row
    allow = error_model.allowance(a, b, tol.grad, tol.elementwise)
    if allow is None:  # a dtype it does not cover
        return replace(row, model_note=error_model.why_none(a, b))
    if allow.opt is None:  # no optimizer to replay: what the gradients' disagreement explains
        unmodelled.fill(a, b, allow, (trace_mod.updates(a), trace_mod.updates(b)))
    bf16_floor.apply(a, b, allow, tol.grad, tol.elementwise)  # bf16's gradient floors and loss term
    return _judged(a, b, tol, label, cfg, sides, with_ulp, allow, derived)


def _judged(a, b, tol, label, cfg, sides, with_ulp, allow, derived=None) -> Row:
    """`judge`'s measures and failures, with the error model's allowances `allow` (or None) and the
    derived bounds `derived` (jaxdp/judge/resolution.py, or None)."""
    d = trace_mod.diff(a, b, check_config=False, with_ulp=with_ulp, allowance=allow, sides=sides)
    steps = range(b.first_step, b.steps + 1)
    worst_at = {}  # (field, step) -> (error, key)
    for key, err in d.norm.items():
        where = _field_and_step(key)
        if where and err >= worst_at.get(where, (-1.0, ""))[0]:
            worst_at[where] = (err, key)
    per_step, worst_key = {f: [] for f in FIELDS}, {}
    for f in ("loss", "grad", "param", "update"):
        per_step[f] = [worst_at.get((f, s), (0.0, ""))[0] for s in steps]
        worst_key[f] = max((worst_at[(f, s)] for s in steps if (f, s) in worst_at), default=(0.0, ""))[1]
    per_step["step update"] = step_update_errors(a, b, allow, d.updates)
    worst = {f: max(v, default=0.0) for f, v in per_step.items()}
    worst_key["step update"] = f"step {b.first_step + int(np.argmax(per_step['step update']))}" if steps else ""
    init_identical = all(np.array_equal(a.arrays[k], b.arrays[k]) for k in b.arrays if k.startswith("init/"))
    row = Row(label, cfg, worst, per_step, worst_key, init_identical, tol, diff=d, allowance=allow,
              model_note=error_model.why_none(a, b, error_model.MODELLED) or "", resolution=derived)
    if allow is not None:
        flagged = derived.flagged() if derived else set()
        row.relaxed = [r for r in relaxed.relaxations(a, b, allow, d, tol, d.floor)
                       if (r.step, r.name) not in flagged]  # "explained by roundoff" only where it is
    row.failures += [f"non-finite: {k} holds NaN or Inf in {_sides(w, sides)}" for k, w in d.non_finite.items()]
    row.failures += [f"spread: {f.describe()}" for f in d.spread if f.fails]  # rank spread (core/traces/spread.py)
    if not init_identical:
        row.failures.append("initial parameters differ")
    for f in FIELDS:
        if worst[f] > tol.bound(f):
            row.failures.append(f"{f} {worst[f]:.2e} > {tol.bound(f):g} at {worst_key.get(f)}")
    elementwise = {k: e for k, e in d.elementwise.items()
                   if (where := _field_and_step(k)) and where[0] in ("grad", "param")}
    if elementwise and max(elementwise.values()) > tol.elementwise:
        key = max(elementwise, key=elementwise.get)
        row.failures.append(f"elementwise {elementwise[key]:.2e} > {tol.elementwise:g} at {key}")
    row.failures += [f"{side}: {msg}" for side, t in zip(sides, (a, b), strict=True) for msg in bf16_reduced(t)]
    row.failures += derived.failures() if derived else []
    row.failures += bf16_floor.scale_failures(a, b)  # bf16: a step's gradients along the reference's
    return row


def kernels_note(a, b, sides=("A", "B")) -> str:
    """'kernels: fused (A) / mirrored (B)': which kernels each trace ran (meta `kernels`; torch_ref's
    `kernels_detail` in brackets); '' when neither meta says (a trace from before `--kernels`, or a user's)."""
    def one(t, side):
        detail = t.meta.get("kernels_detail") or {}
        what = ", ".join(f"{k} {v}" for k, v in detail.items() if v not in (None, False))
        return f"{t.meta.get('kernels', 'unrecorded')} ({side}{': ' + what if what else ''})"

    if "kernels" not in a.meta and "kernels" not in b.meta:
        return ""
    return f"kernels: {one(a, sides[0])} / {one(b, sides[1])}"


def _field_and_step(key: str):
    """('grad', 3) for step/3/grad/<name>, ('update', 3) for update/3/<name>, ('loss', 3); else None."""
    parsed = trace_mod.parse_key(key)
    if parsed is None or parsed.kind not in ("update", "loss", "grad", "param"):
        return None
    return parsed.kind, parsed.step


def _sides(which: str, sides) -> str:
    return {"a": sides[0], "b": sides[1]}.get(which, f"{sides[0]} and {sides[1]}")


def step_update_errors(a, b, allow=None, ups=None) -> list[float]:
    """Per step: ||du_a - du_b|| / ||du_b|| over all tensors at once (inf where non-finite), the
    difference measured beyond `allow`'s per-element allowances (jaxdp.judge.error_model); `ups`: both updates."""
    ua, ub = ups or (trace_mod.updates(a), trace_mod.updates(b))
    out = []
    for s in range(b.first_step, b.steps + 1):
        keys = [k for k in ub if k.startswith(f"update/{s}/") and k in ua]
        if not all(np.isfinite(ua[k]).all() and np.isfinite(ub[k]).all() for k in keys):
            out.append(math.inf)
            continue
        over = {k: error_model.excess(ua[k], ub[k], allow.update.get(k) if allow else None) for k in keys}
        num = math.sqrt(sum(float(np.sum(over[k] ** 2)) for k in keys))
        den = math.sqrt(sum(float(np.sum(ub[k] ** 2)) for k in keys))
        out.append(num / den if den > 0 else num)
    return out


def bf16_reduced(t) -> list[str]:
    """The fp32-reduction claim, on the trace: in a bf16 run on N > 1 devices each device's gradient
    is a bfloat16 value (the backward of bf16 compute) and the reduction sums N of them in fp32, whose
    sum is itself a bfloat16 value only when it fits in 8 significant bits (measured: 40-55% of the
    elements). A reduction in bf16 leaves every element a bfloat16 value: a step where >= 90% are
    is reported."""
    if t.meta.get("dtype") != "bfloat16" or int(t.meta.get("devices", 1)) < 2:
        return []
    grads: dict[int, list] = {}
    for key, v in t.arrays.items():
        if (where := _field_and_step(key)) and where[0] == "grad":
            grads.setdefault(where[1], []).append(np.asarray(v, np.float32).reshape(-1))
    for s, g in sorted(grads.items()):
        fraction = np.mean((np.concatenate(g).view(np.uint32) & 0xFFFF) == 0)
        if fraction >= 0.9:
            return [f"step/{s}/grad: {fraction:.0%} of the gradient elements are bfloat16 values "
                    f"(reduced in bf16, not fp32?)"]
    return []


def compare(jax_trace, torch_trace, cfg: RunConfig, label: str = "") -> Row:
    """Judge the jaxdp trace of `cfg` against torch_ref's with `tolerance(cfg)`."""
    return judge(jax_trace, torch_trace, tolerance(cfg), label, cfg, sides=("jax", "torch"))


def format_table(rows: list[Row]) -> str:
    """One line per row: the worst error of each measure and the verdict; then the bounds."""
    head = f"{'strategy':<16} {'N':>2} {'init':>9} " + " ".join(f"{f:>11}" for f in FIELDS) + "  verdict"
    lines = [head, "-" * len(head)]
    for r in rows:
        init = "identical" if r.init_identical else "DIFFER"
        verdict = "ok" if r.ok else "MISMATCH: " + "; ".join(r.failures)
        devices = r.cfg.devices if r.cfg else "-"
        lines.append(f"{r.label:<16} {devices:>2} {init:>9} " + " ".join(f"{r.worst[f]:>11.2e}" for f in FIELDS)
                     + f"  {verdict}")
    if rows:
        lines.append(format_tolerance(rows[0].tol, rows[0].cfg.dtype if rows[0].cfg else ""))
    return "\n".join(lines)


def format_tolerance(tol: Tolerance, dtype: str = "") -> str:
    bounds = ", ".join(f"{f} {tol.bound(f):g}" for f in FIELDS + ("elementwise",) if math.isfinite(tol.bound(f)))
    return f"tolerance ({dtype}): {bounds}; {tol.why}"
