"""Run mutations and judge them: `evaluate(cases)` trains each (mutation, framework, dtype, model) case
(model 'own': the entry's run; else a family of `jax_hf_models`, jaxdp's model from a transformers config) with
its bug, the honest references it is judged against, and reports which checks caught it:

  strategy  `parity.judge` against `single` of the same framework and dtype (the strategy tests' check)
  parity    `parity.judge` against the other framework's honest run of the same strategy
  program   the reduction's dtype: jaxdp's compiled HLO collectives, torch's process-group tensors
            (`torch_bugs.collective_dtypes`): a float type narrower than the master dtype
  replicas  jaxdp's replica consistency after each step (`checks.replica_mismatches`)

and, as controls, whether the honest run passes each check it ran (a check that fails honest runs
proves nothing by failing a broken one); and where the judge locates it: the first divergence of the bug's
run from `single` (`divergence.compare`: its step, field and tensor), which must exist within `MAX_STEP`
steps (and name the entry's `where`). The transformers-config cases run the checks that need no torch twin
of the model (all but `parity`)."""
from __future__ import annotations

import functools
import re

from jaxdp.core.traces import trace
from jaxdp.harness import pair_runs
from jaxdp.judge import divergence, parity

from . import BY_NAME, config, jax_hf_models, plant
from .checks import compiled_step, replica_mismatches

NARROWER = {"float64": {"f32", "bf16", "f16", "float", "c10::BFloat16", "c10::Half"},
            "float32": {"bf16", "f16", "c10::BFloat16", "c10::Half"}}
NARROWER["bfloat16"] = NARROWER["float32"]  # fp32 reduction claimed
OTHER = {"jax": "torch", "torch": "jax"}
MAX_STEP = 20  # a bug must be located by this step


def case_config(name: str, fw: str, dtype: str, model: str = "own", kernels: str = "mirrored"):
    """The run of a case: the entry's, or the entry's on a transformers-config model (`jax_hf_models.config`)."""
    m = BY_NAME[name]
    cfg = config(m, fw, dtype, kernels)
    return cfg if model == "own" else jax_hf_models.config(model, cfg, **m.hf_run)


def required(name: str, model: str = "own") -> tuple:
    """The checks a case must pass: the entry's; on a transformers-config model all but `parity`."""
    checks = BY_NAME[name].checks
    return checks if model == "own" else tuple(c for c in checks if c != "parity")


def _single(cfg):
    return cfg.replace(strategy="single", devices=1, replicas=1)


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


def dtypes_job():
    """The job every rank runs to read what its collectives carried (`torch_bugs.collective_dtypes`)."""
    from .torch_bugs import collective_dtypes

    return collective_dtypes


def torch_items(cases, kernels: str = "mirrored") -> list:
    """The torch_ref runs `evaluate(cases, kernels=kernels)` needs (items of `pair_runs.run_torch`)."""
    items = []
    for name, fw, dtype, *model in cases:
        if model and model[0] != "own":
            continue  # the transformers-config cases' torch runs are torch_bugs' own
        m = BY_NAME[name]
        cfg = config(m, fw, dtype, kernels)
        items.append(cfg)  # the honest run: torch's control, or jaxdp's parity reference
        if fw == "torch":
            items += [(cfg, plant(name)), _single(cfg)]
            if "program" in m.checks:
                items += [(cfg, plant(name), dtypes_job()), (cfg, None, dtypes_job())]
    return list(dict.fromkeys(items))


def evaluate(cases, progress=lambda message: None, torch=None, kernels: str = "mirrored") -> list[dict]:
    """[{'case': (name, framework, dtype, model), 'caught': {check: (caught, why)}, 'controls': {check: failure},
    'located': (step, field, tensor) or None}], every run with `kernels` (both frameworks: the bug's run, its
    `single` and the other framework's). A case of three items is on the model 'own'.
    `torch`: the results of `pair_runs.run_torch(torch_items(cases, kernels) + ...)` when already run."""
    cases = [(*c, "own") if len(c) == 3 else tuple(c) for c in cases]
    if torch is None:
        progress(f"torch_ref: {len(cases)} cases' runs")
        torch = pair_runs.run_torch(torch_items(cases, kernels))
    jax = functools.cache(_run_jax)
    out = []
    for case in cases:
        progress(" in ".join((case[0], ", ".join(case[1:]))))
        try:
            out.append(_case(case, jax, torch, kernels))
        except Exception as error:  # noqa: BLE001 (one case's failure is its row, the others still run)
            line = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
            out.append({"case": case, "caught": {}, "located": None, "controls": {}, "error": line})
    return out


def _case(case, jax, torch, kernels) -> dict:
    name, fw, dtype, model = case
    cfg = case_config(name, fw, dtype, model, kernels)
    run = (lambda c, mut=None: jax(c, mut, model)) if fw == "jax" else (
        lambda c, mut=None: torch[(c, plant(mut)) if mut else c])
    bad, honest, single = run(cfg, name), run(cfg), run(_single(cfg))
    checks = required(name, model)
    caught = {"strategy": _judge(bad, single, (fw, "single"))}
    controls = {"strategy": _judge(honest, single, (fw, "single"))}
    if "parity" in checks:
        other = (lambda c: torch[c]) if fw == "jax" else (lambda c: jax(c, None, model))
        caught["parity"] = _judge(bad, other(cfg), (fw, OTHER[fw]))
        controls["parity"] = _judge(honest, other(cfg), (fw, OTHER[fw]))
    with jax_hf_models.built(model) if fw == "jax" and model != "own" else _nothing():
        if "program" in checks:
            caught["program"], controls["program"] = _program(cfg, name, fw, torch)
        if "replicas" in checks:
            caught["replicas"], controls["replicas"] = _replicas(cfg, name)
    return {"case": case, "caught": caught, "located": located(bad, single) or named(caught),
            "controls": {k: why for k, (failed, why) in controls.items() if failed}}


def _run_jax(cfg, mutation=None, model="own"):
    if model == "own":
        return pair_runs.run_jax(cfg, plant(mutation))
    with jax_hf_models.built(model):
        return pair_runs.run_jax(cfg, plant(mutation))


def _nothing():
    import contextlib

    return contextlib.nullcontext()


def located(bad, single) -> tuple | None:
    """(step, field, tensor) of the judge's first divergence of `bad` from `single`; None when it finds none."""
    report = divergence.compare(trace.Trace(bad.meta, bad.arrays), trace.Trace(single.meta, single.arrays),
                                check_config=False)
    first = report.first
    return None if first is None else (first.step, first.field, first.name)


def _program(cfg, name, fw, torch) -> tuple:
    if fw == "jax":
        from . import inject

        with inject("jax", name):
            bad = _narrow(compiled_step(cfg)[1], cfg.dtype)
        honest = _narrow(compiled_step(cfg)[1], cfg.dtype)
    else:
        bad = "; ".join(filter(None, (_narrow(r, cfg.dtype) for r in torch[(cfg, plant(name), dtypes_job())])))
        honest = "; ".join(filter(None, (_narrow(r, cfg.dtype) for r in torch[(cfg, None, dtypes_job())])))
    return (bool(bad), bad), (bool(honest), honest)


def _replicas(cfg, name) -> tuple:
    from . import inject

    with inject("jax", name):
        bad = replica_mismatches(cfg)
    honest = replica_mismatches(cfg)
    return (bool(bad), bad[0] if bad else ""), (bool(honest), honest[0] if honest else "")


_KEY = re.compile(r"step/(\d+)/(\w+)(?:/(\S+?))?[:;,)\s]")
_REPLICA = re.compile(r"step (\d+): \['(\w+)'\]((?:\[[^\]]+\])+): copies differ")


def named(caught: dict) -> tuple | None:
    """Where a check that caught the case names it, when the first divergence finds no tensor beyond its bound:
    the judge's measure over a whole field (bf16 values: every gradient element a bf16 value, `step/1/grad`) or
    the replica check (`step 1: ['params']['layers'][0]['kernel']: copies differ`, field `params (replicas)`)."""
    for _, why in (v for v in caught.values() if v[0]):
        if (m := _REPLICA.search(why)):
            tensor = "/".join(part.strip("'") for part in re.findall(r"\[([^\]]+)\]", m.group(3)))
            return int(m.group(1)), f"{m.group(2)} (replicas)", tensor
        if (m := _KEY.search(why + " ")):
            return int(m.group(1)), m.group(2), m.group(3) or f"every {m.group(2)} tensor"
    return None


def missed(result: dict) -> list[str]:
    """The required checks that did not catch the case, the controls that failed, and a bug the judge did not
    locate (within `MAX_STEP` steps, at the entry's `where`): [] is a pass."""
    name, model = result["case"][0], (result["case"][3:] or ("own",))[0]
    if "error" in result:
        return [f"the run failed: {result['error']}"]
    out = [f"{check} missed it" for check in required(name, model) if not result["caught"][check][0]]
    out += [f"honest run fails {check}: {why}" for check, why in result["controls"].items()]
    where = result.get("located", ())
    if not where or where[0] > MAX_STEP:
        out.append(f"not located within {MAX_STEP} steps")
    elif BY_NAME[name].where not in where[2]:
        out.append(f"located at {where[2]}, not at {BY_NAME[name].where}")
    return out
