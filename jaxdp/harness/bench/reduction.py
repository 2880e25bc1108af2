"""Item 9: what `--reduction canonical` costs against `native`, per strategy (issue 16).

Canonical needs XLA:CPU's fused multiply-adds off from the start of the process (`devices.NO_FMA`,
read when JAX starts), so both modes are compiled and timed in a child process started with that
flag: its `native` numbers are also without FMA. For each strategy (ZeRO with both collectives) and
N, the two steps are compiled from the same configuration, warmed up, then called in turn
(interleaved repetitions: load from elsewhere on the machine falls on both alike); the statistic is
the median step time and the ratio canonical / native. From each compiled program: the bytes each
device sends per step (`accounting.communication` on its HLO) and its temporaries
(`memory_analysis()`). In the full run a second child, started without the flag, times `native`
alone (same configurations): the flag's own cost, `native_step_s` / `native_fma_step_s` (two
processes, not interleaved). Then torch_ref's side (`reduction_torch.py`: the rows whose strategy torch_ref
has, by its own `canonical_cost`, each beside the jaxdp row's ratio).
The cnn with sync BatchNorm gets rows of its own (`"model": "cnn"`):
its timed call is the running statistics' program then the train step, and its bytes are both
programs' (also apart: `*_train_bytes`, `*_stats_bytes`). Also runnable alone:
`python -m jaxdp.harness.bench.reduction [--quick] --out DIR` (writes reduction.json and reduction.md).
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

import jax

from ... import devices
from ...analysis import accounting
from ...core.files import atomic
from ...core.run.config import RunConfig
from ...core.run.reduction import resolve_shards
from .plan import Plan, plan, reduction_configs, reduction_models, reduction_runs
from .reduction_torch import side_by_side, torch_rows
from .tables import jsonable, ratio

WARMUP_CALLS = 2
CHILD_TIMEOUT_S = 1800
KEYS = ("native_step_s", "canonical_step_s", "ratio", "native_bytes", "canonical_bytes", "native_temp_bytes",
        "canonical_temp_bytes")


def configs(base: RunConfig, strategy: str, collectives: str | None, n: int, modes: tuple) -> list[RunConfig]:
    return [c.validate("jax") for c in reduction_configs(base, strategy, collectives, n, modes)]


# ---- in the child process ------------------------------------------------------------------------


def _compiled(cfg: RunConfig) -> dict:
    c = accounting.compile_step(cfg)
    comm = accounting.communication(c.program.as_text(), cfg.devices)
    out = {"program": c.program, "state": c.state, "batch": c.batch, "bytes": comm["total"],
           "ops": {k: v["ops"] for k, v in comm.items() if k != "total" and v["ops"]},
           "temp_bytes": accounting.step_memory(c.program)["temp_bytes"], "compile_s": c.lower_s + c.compile_s}
    if c.stats_program is not None:  # BatchNorm: the running statistics' program runs before each step
        stats = accounting.communication(c.stats_program.as_text(), cfg.devices)
        out |= {"stats": c.stats_program, "batch_stats": c.problem.state, "stats_bytes": stats["total"],
                "stats_ops": {k: v["ops"] for k, v in stats.items() if k != "total" and v["ops"]}}
    return out


def _call(s: dict) -> None:
    """One step as `jaxdp.parallelize`'s runs it: the statistics program first (BatchNorm, on the
    state's parameters before the step donates them), then the train step."""
    if "stats" in s:
        jax.block_until_ready(s["stats"](s["state"].params, s["batch_stats"], s["batch"][0]))
    s["state"], metrics = s["program"](s["state"], *s["batch"])
    jax.block_until_ready((s["state"], metrics["loss"]))  # ddp-pmap's loss: one per device


def interleaved(steps: list[dict], repeats: int) -> list[float]:
    """Median wall seconds of one step of each compiled program, called in turn (after WARMUP_CALLS);
    each feeds its new (donated) state to its next call."""
    times = [[] for _ in steps]
    for i in range(WARMUP_CALLS + repeats):
        for s, t in zip(steps, times, strict=True):
            t0 = time.perf_counter()
            _call(s)
            if i >= WARMUP_CALLS:
                t.append(time.perf_counter() - t0)
    return [statistics.median(t) for t in times]


models = reduction_models  # item 9's models by label (plan.py)


def _row(label: str, strategy: str, coll: str | None, n: int, modes: tuple, compiled: list, step_s: list) -> dict:
    row = {"model": label, "strategy": strategy, "collectives": coll, "devices": n}
    for mode, c, t in zip(modes, compiled, step_s, strict=True):
        row |= {f"{mode}_step_s": t, f"{mode}_bytes": c["bytes"] + c.get("stats_bytes", 0),
                f"{mode}_temp_bytes": c["temp_bytes"], f"{mode}_ops": c["ops"], f"{mode}_compile_s": c["compile_s"]}
        if "stats" in c:  # the statistics program's own bytes and collectives (in {mode}_bytes too)
            row |= {f"{mode}_train_bytes": c["bytes"], f"{mode}_stats_bytes": c["stats_bytes"],
                    f"{mode}_stats_ops": c["stats_ops"]}
    return row


def child(quick: bool, modes: tuple = ("native", "canonical")) -> list[dict]:
    """Every (model, strategy, collectives, N) of the plan in `modes`, measured in this process (which
    must have been started with the flag when "canonical" is among them)."""
    p = plan(quick)
    devices.setup(max(n for *_, n in reduction_runs(p)), "cpu",
                  reduction="canonical" if "canonical" in modes else "native")
    rows = []
    for label, model, strategy, coll, n in reduction_runs(p):
        print(f"bench: reduction {label} {strategy}{'' if coll is None else f' ({coll})'} N={n}: {', '.join(modes)}",
              file=sys.stderr, flush=True)
        compiled = [_compiled(c) for c in configs(model, strategy, coll, n, modes)]
        rows.append(_row(label, strategy, coll, n, modes, compiled, interleaved(compiled, p.reduction_repeats)))
    return jsonable(rows)


# ---- in the bench's process ----------------------------------------------------------------------


def _child_env(fma: bool) -> dict:
    flags = os.environ.get("XLA_FLAGS", "").replace(devices.NO_FMA, "").strip()
    if not fma:
        flags = f"{flags} {devices.NO_FMA}".strip()
    return {**os.environ, "XLA_FLAGS": flags, "JAX_PLATFORMS": "cpu"}


def run_child(quick: bool, fma: bool, modes: tuple, timeout_s: float = CHILD_TIMEOUT_S) -> list[dict]:
    """`child` in a fresh process started with (fma=False) or without the no-FMA flag; its progress
    goes to this process's stderr."""
    code = (f"import json, sys; from jaxdp.harness.bench import reduction; "
            f"json.dump(reduction.child({quick!r}, {modes!r}), sys.stdout)")
    proc = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, timeout=timeout_s,
                          process_group=0,  # Ctrl-C reaches the bench alone, which kills and reaps the child
                          env=_child_env(fma))
    if proc.returncode:
        raise RuntimeError(f"bench: the reduction child ({'with' if fma else 'without'} FMA) failed with exit "
                           f"status {proc.returncode}; its stderr is above")
    return json.loads(proc.stdout)


def _key(r: dict) -> tuple:
    return r.get("model", "mlp"), r["strategy"], r["collectives"], r["devices"]


def table(rows: list[dict], fma_rows: list[dict] | None, by_label: dict) -> list[dict]:
    """bench.json's rows: both modes side by side, canonical's extra bytes and temporaries, the shard
    count S (from the row's model in `by_label`, `models(plan)`), and (when measured) native with FMA
    on and the no-FMA flag's cost."""
    fma = {_key(r): r["native_step_s"] for r in fma_rows or []}
    out = []
    for r in rows:
        model = by_label[r.get("model", "mlp")]
        row = {**r, "ratio": ratio(r["canonical_step_s"], r["native_step_s"]),
               "shards": resolve_shards(model.shards, model.batch_size // model.accum, r["devices"],
                                         model.tokens_per_row()),
               "extra_bytes": r["canonical_bytes"] - r["native_bytes"],
               "bytes_ratio": ratio(r["canonical_bytes"], r["native_bytes"]),
               "extra_temp_bytes": r["canonical_temp_bytes"] - r["native_temp_bytes"],
               "temp_ratio": ratio(r["canonical_temp_bytes"], r["native_temp_bytes"])}
        if _key(r) in fma:
            row |= {"native_fma_step_s": fma[_key(r)], "no_fma_cost": ratio(r["native_step_s"], fma[_key(r)])}
        out.append(row)
    return out


def reduction_benchmark(p: Plan, say) -> dict:
    """Item 9: {"rows", "setup"}; both modes in one child without FMA, native with FMA in a second
    (the full run only)."""
    say(f"bench: reduction canonical vs native, {len(list(reduction_runs(p)))} rows ({', '.join(models(p))}); in a "
        f"child process started with XLA_FLAGS={devices.NO_FMA}")
    rows = run_child(p.quick, fma=False, modes=("native", "canonical"))
    fma_rows = None
    if p.reduction_fma:
        say("bench: reduction: native again in a child process with FMA on (the flag's own cost)")
        fma_rows = run_child(p.quick, fma=True, modes=("native",))
    m = p.reduction_model
    bn = p.reduction_bn_model
    jax_rows = table(rows, fma_rows, models(p))
    return {"rows": jax_rows, "torch_rows": side_by_side(torch_rows(p, say), jax_rows),
            "setup": {"xla_flags": devices.NO_FMA, "fma_reference": fma_rows is not None,
                      "repeats": p.reduction_repeats, "warmup_calls": WARMUP_CALLS, "statistic": "median",
                      "model": {f: getattr(m, f) for f in ("model", "hidden", "batch_size", "accum", "dtype",
                                                           "optimizer", "shards")},
                      "bn_model": None if bn is None else {f: getattr(bn, f) for f in (
                          "model", "channels", "batchnorm", "batch_size", "accum", "dtype", "optimizer", "shards")},
                      "more_models": {label: {f: getattr(c, f) for f in ("model", "batch_size", "seq_len", "shards")}
                                      for label, c, *_ in p.reduction_more},
                      "bn_note": "cnn rows: each timed call is the running statistics' program then the train step "
                                 "(as parallelize's step runs them); *_bytes = the train step's + the statistics "
                                 "program's (*_train_bytes + *_stats_bytes); temporaries: the train step's",
                      "note": f"Both modes compiled and timed in one process started with XLA_FLAGS={devices.NO_FMA} "
                              "(canonical needs it): native there is without fused multiply-adds too"}}


if __name__ == "__main__":
    import argparse

    from .markdown import reduction_section

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny models, N = 2: mlp ddp and zero1 (xla), cnn ddp")
    parser.add_argument("--out", default="reports/bench", help="folder for reduction.json and reduction.md")
    args = parser.parse_args()
    t0 = time.perf_counter()
    result = reduction_benchmark(plan(args.quick), lambda m: print(m, file=sys.stderr, flush=True))
    result["wall_s"] = time.perf_counter() - t0
    result["load_average"] = os.getloadavg()
    with atomic.staged(args.out) as stage:  # both files or neither
        atomic.write_json(os.path.join(stage, "reduction.json"), jsonable(result), indent=1)
        section = "\n".join(reduction_section({"reduction": result})) + "\n"
        atomic.write_text(os.path.join(stage, "reduction.md"), section)
    print(f"wrote {os.path.join(args.out, 'reduction.json')} and reduction.md")
