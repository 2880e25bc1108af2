"""Run mutations and judge them: `evaluate(cases)` trains each (mutation, framework, dtype) case with
its bug, the honest references it is judged against, and reports which checks caught it:

  strategy  `parity.judge` against `single` of the same framework and dtype (the strategy tests' check)
  parity    `parity.judge` against the other framework's honest run of the same strategy
  program   the reduction's dtype: jaxdp's compiled HLO collectives, torch's process-group tensors
            (`torch_bugs.collective_dtypes`): a float type narrower than the master dtype
  replicas  jaxdp's replica consistency after each step (`checks.replica_mismatches`)

and, as controls, whether the honest run passes each check it ran (a check that fails honest runs
proves nothing by failing a broken one)."""
from __future__ import annotations

import functools

from ...core.traces import trace
from ...judge import parity
from .. import pair_runs
from . import BY_NAME, config
from .checks import compiled_step, replica_mismatches

NARROWER = {"float64": {"f32", "bf16", "f16", "float", "c10::BFloat16", "c10::Half"},
            "float32": {"bf16", "f16", "c10::BFloat16", "c10::Half"}}
NARROWER["bfloat16"] = NARROWER["float32"]  # fp32 reduction claimed
OTHER = {"jax": "torch", "torch": "jax"}


def _single(cfg):
    return cfg.replace(strategy="single", devices=1)


def _judge(a, b, sides) -> tuple[bool, str]:
    """(failed, the measures that failed and the first failure beyond the loss)."""
    row = parity.judge(trace.Trace(a.meta, a.arrays), trace.Trace(b.meta, b.arrays), sides=sides)
    if row.ok:
        return False, ""
    measures = list(dict.fromkeys(_measure(f) for f in row.failures))
    detail = next((f for f in row.failures if not f.startswith("loss")), row.failures[0])
    return True, f"{', '.join(measures)} ({detail})"


def _measure(failure: str) -> str:
    for name in ("step update", "non-finite", "initial parameters", "elementwise"):
        if failure.startswith(name):
            return name
    return "bf16 values" if "bfloat16 values" in failure else failure.split(" ")[0]


def _narrow(dtypes_by_op: dict, dtype: str) -> str:
    bad = {op: sorted(set(d) & NARROWER[dtype]) for op, d in dtypes_by_op.items() if set(d) & NARROWER[dtype]}
    return "; ".join(f"{op} carries {', '.join(d)}" for op, d in bad.items())


def torch_items(cases, kernels: str = "mirrored") -> list:
    """The torch_ref runs `evaluate(cases, kernels=kernels)` needs (items of `pair_runs.run_torch`)."""
    items = []
    for name, fw, dtype in cases:
        m = BY_NAME[name]
        cfg = config(m, fw, dtype, kernels)
        items.append(cfg)  # the honest run: torch's control, or jaxdp's parity reference
        if fw == "torch":
            items += [(cfg, name), _single(cfg)]
            if "program" in m.checks:
                items += [(cfg, name, "dtypes"), (cfg, None, "dtypes")]
    return list(dict.fromkeys(items))


def evaluate(cases, progress=lambda message: None, torch=None, kernels: str = "mirrored") -> list[dict]:
    """[{'case': (name, framework, dtype), 'caught': {check: (caught, why)}, 'controls': {check: failure}}],
    every run with `kernels` (both frameworks: the bug's run, its `single` and the other framework's).
    `torch`: the results of `pair_runs.run_torch(torch_items(cases, kernels) + ...)` when already run."""
    if torch is None:
        progress(f"torch_ref: {len(cases)} cases' runs")
        torch = pair_runs.run_torch(torch_items(cases, kernels))
    jax = functools.cache(lambda cfg, mutation=None: pair_runs.run_jax(cfg, mutation))
    out = []
    for name, fw, dtype in cases:
        progress(f"{name} in {fw}, {dtype}")
        m = BY_NAME[name]
        cfg = config(m, fw, dtype, kernels)
        run = jax if fw == "jax" else (lambda c, mut=None: torch[(c, mut) if mut else c])
        other = (lambda c: torch[c]) if fw == "jax" else jax
        bad, honest, single = run(cfg, name), run(cfg), run(_single(cfg))
        caught = {"strategy": _judge(bad, single, (fw, "single")), "parity": _judge(bad, other(cfg), (fw, OTHER[fw]))}
        controls = {"strategy": _judge(honest, single, (fw, "single")), "parity": _judge(honest, other(cfg),
                                                                                       (fw, OTHER[fw]))}
        if "program" in m.checks:
            caught["program"], controls["program"] = _program(cfg, name, fw, torch)
        if "replicas" in m.checks:
            caught["replicas"], controls["replicas"] = _replicas(cfg, name)
        out.append({"case": (name, fw, dtype), "caught": caught,
                    "controls": {k: why for k, (failed, why) in controls.items() if failed}})
    return out


def _program(cfg, name, fw, torch) -> tuple:
    if fw == "jax":
        from . import inject

        with inject("jax", name):
            bad = _narrow(compiled_step(cfg)[1], cfg.dtype)
        honest = _narrow(compiled_step(cfg)[1], cfg.dtype)
    else:
        bad = "; ".join(filter(None, (_narrow(r, cfg.dtype) for r in torch[(cfg, name, "dtypes")])))
        honest = "; ".join(filter(None, (_narrow(r, cfg.dtype) for r in torch[(cfg, None, "dtypes")])))
    return (bool(bad), bad), (bool(honest), honest)


def _replicas(cfg, name) -> tuple:
    from . import inject

    with inject("jax", name):
        bad = replica_mismatches(cfg)
    honest = replica_mismatches(cfg)
    return (bool(bad), bad[0] if bad else ""), (bool(honest), honest[0] if honest else "")


def missed(result: dict) -> list[str]:
    """The required checks that did not catch the case, and the controls that failed: [] is a pass."""
    name = result["case"][0]
    out = [f"{check} missed it" for check in BY_NAME[name].checks if not result["caught"][check][0]]
    return out + [f"honest run fails {check}: {why}" for check, why in result["controls"].items()]
