"""The honest matrix (issue 35, "Must hold" 2): zero false alarms of `jaxdp.judge.parity.judge` over honest
comparisons, and the worst honest ratio (measure / bound) of every bound, constant and derived.

    python -m tests.mutations.honest [--quick] [--jsonl FILE]

Two covering sets (every pair of values of any two dimensions meets in at least one case):

  project   jaxdp and torch_ref on the project's models (mlp, gpt, gpt2, llama, cnn with sync
            BatchNorm) x every strategy (jaxdp's ddp-pmap against torch_ref's ddp-naive, the -jit ones
            against their torch twins) x N in {1, 2, 3, 4} x sgd/momentum/adam/adamw x
            float64/float32/bfloat16. Each case judges jaxdp's run against jaxdp's `single`, torch_ref's
            against torch_ref's `single` and jaxdp's against torch_ref's; each (model, optimizer, dtype)
            also judges jaxdp's `single` against torch_ref's.
  hf        transformers' models from configs (`hf_models`: twelve families, each with its trap) under
            torch_ref's strategies x N x float64/float32/bfloat16 (autocast over float32 master
            parameters, `compute_dtype=torch.bfloat16`) x AdamW (torch's defaults)/Adam/momentum/sgd,
            each against the same model under `single`.

`--results FILE` writes every comparison (case, pass, worst ratio per measure, failures) and the summary
(`honest_render.summarise`) as JSON; `python -m tests.mutations.honest_render` renders it into
docs/PARITY.md. The summary (markdown, `honest_render.render`) also goes to stdout. `--promote` runs the
float64 transformers models with their float32 sites promoted (`hf_honest.promoted_sites`).
"""
from __future__ import annotations

import argparse
import collections
import itertools
import json
import math
import os
import sys
import time
from dataclasses import dataclass, field

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads: see torch_ref/__init__.py

from jaxdp.core.files import atomic  # noqa: E402
from jaxdp.core.registry import strategies as registry  # noqa: E402
from jaxdp.core.run.config import ConfigError, RunConfig  # noqa: E402
from jaxdp.core.run.hsdp_hosts import per_strategy  # noqa: E402
from jaxdp.core.traces import trace  # noqa: E402
from jaxdp.harness import pair_runs  # noqa: E402
from jaxdp.judge import parity, resolution  # noqa: E402

from . import hf_honest, hf_models, honest_render  # noqa: E402

# (jaxdp strategy, torch_ref strategy): every strategy of both frameworks, the framework-only ones paired.
# (those that equal single: diloco, with its own oracle, has its own tests)
STRATEGIES = [(s, s) for s in registry.names("jax", one_device=False, oracle="single")
              if registry.entry(s).in_framework("torch")] + [
    ("ddp-pmap", "ddp-naive")]  # the registry's rows (jaxdp/core/registry/strategies.py)
MODELS = {
    "mlp": dict(model="mlp", data="synthetic", hidden=(8, 8)),
    "gpt": dict(model="gpt", data="text", n_layer=1, n_head=2, d_model=16, seq_len=8),
    "gpt2": dict(model="gpt2", data="text", n_layer=1, n_head=2, d_model=16, seq_len=8),
    "llama": dict(model="llama", data="text", n_layer=1, n_head=2, n_kv_head=1, d_model=16, d_ff=32, seq_len=8),
    "cnn": dict(model="cnn", data="digits", channels=(4, 4), batchnorm="sync"),
}
OPTIMIZERS = {"sgd": dict(lr=0.05, weight_decay=0.01), "momentum": dict(lr=0.05), "adam": dict(lr=1e-3),
              "adamw": dict(lr=1e-3, weight_decay=0.01)}
BASE = RunConfig(batch_size=24, steps=4, seed=3, bucket_mb=0.002)  # 24 rows: N x accum divides it for N <= 4
PROJECT = dict(strategy=STRATEGIES, devices=[1, 2, 3, 4], model=list(MODELS), optimizer=list(OPTIMIZERS),
               dtype=["float64", "float32", "bfloat16"])
HF = dict(model=hf_models.FAMILIES,
          strategy=list(registry.names("torch", twin="", one_device=False, oracle="single")),
          devices=[1, 2, 3, 4], dtype=["float64", "float32", "bfloat16"],
          optimizer=["adamw", "adam", "momentum", "sgd"])
PROMOTE = False  # float64 transformers models as built: the judge reads their float32 sites from the census
CONSTANT = ("loss", "grad", "param", "update", "step update")
MEASURES = CONSTANT + resolution.MEASURES


def covering(dims: dict[str, list], valid=lambda case: True) -> list[dict]:
    """A greedy pairwise covering set of the `valid` cases: each case the valid one that meets most
    uncovered pairs, among those the one whose values the cases so far used least (so that a dimension's
    values share the cases evenly); a pair no valid case holds stays uncovered."""
    names = list(dims)
    pairs = list(itertools.combinations(range(len(names)), 2))
    todo = {(i, a, j, b) for i, j in pairs for a in range(len(dims[names[i]])) for b in range(len(dims[names[j]]))}
    product = [c for c in itertools.product(*(range(len(dims[n])) for n in names))
               if valid({n: dims[n][v] for n, v in zip(names, c, strict=True)})]
    cases, used = [], collections.Counter()
    while todo:
        best = max(product, key=lambda c: (sum((i, c[i], j, c[j]) in todo for i, j in pairs),
                                           -sum(used[i, v] for i, v in enumerate(c))))
        if not todo & {(i, best[i], j, best[j]) for i, j in pairs}:
            break
        todo -= {(i, best[i], j, best[j]) for i, j in pairs}
        used.update(enumerate(best))
        cases.append({n: dims[n][v] for n, v in zip(names, best, strict=True)})
    return cases


@dataclass
class Record:
    """One honest comparison: its label, the judge's verdict and each measure's worst ratio to its bound."""
    label: str
    ok: bool
    ratios: dict = field(default_factory=dict)
    failures: list = field(default_factory=list)


def ratios(row: parity.Row) -> dict:
    """{measure: worst / bound} for the constant bounds judged (finite) and the derived ones (when applied)."""
    out = {f: row.worst[f] / row.tol.bound(f) for f in CONSTANT if math.isfinite(row.tol.bound(f))}
    for measure in resolution.MEASURES:
        found = row.resolution.worst(measure) if row.resolution else None
        if found is not None:
            out[measure] = found.ratio
    return out


def judged(label: str, a: trace.Trace, b: trace.Trace) -> Record:
    row = parity.judge(a, b, label=label, check_config=False)  # single runs accum 1: the same step
    return Record(label, row.ok, ratios(row), row.failures)


def configs(case: dict) -> tuple[RunConfig, RunConfig]:
    """The jaxdp and torch_ref configurations of a project case (accum 2 wherever N x 2 divides the batch)."""
    jax_name, torch_name = case["strategy"]
    n = case["devices"]
    cfg = BASE.replace(devices=n, dtype=case["dtype"], optimizer=case["optimizer"], accum=1 if n == 3 else 2,
                       **MODELS[case["model"]], **OPTIMIZERS[case["optimizer"]])
    if registry.entry(jax_name).grid:
        cfg = cfg.replace(replicas=2 if n % 2 == 0 else 1)
    return (per_strategy(cfg, jax_name).replace(strategy=jax_name).validate("jax"),
            per_strategy(cfg, torch_name).replace(strategy=torch_name).validate("torch"))


def single_of(cfg: RunConfig) -> RunConfig:
    """The reference: `single`, accum 1 (the same step), but the run's accum under BatchNorm, whose
    statistics are the micro-batch's (another accum is another function)."""
    return per_strategy(cfg, "single").replace(devices=1, accum=cfg.accum if cfg.model == "cnn" else 1)


def _trace(result) -> trace.Trace:
    return trace.Trace(result.meta, result.arrays)


def _torch_runs(cfgs: list) -> dict:
    """torch_ref's traces, a world per N; a world that fails leaves its runs out (each case then says so)."""
    out = {}
    for n in sorted({c.devices for c in cfgs}):
        group = list(dict.fromkeys(c for c in cfgs if c.devices == n))
        try:
            out |= {c: _trace(r) for c, r in pair_runs.run_torch(group).items()}
        except Exception as e:  # noqa: BLE001 (reported per case)
            print(f"torch_ref world N={n} failed: {e}", flush=True)
    return out


def project(cases: list, log) -> list[Record]:
    """Every project case, its three comparisons; each (model, optimizer, dtype)'s singles across."""
    pairs = [configs(c) for c in cases]
    torch = _torch_runs([t for _, t in pairs] + [single_of(t) for _, t in pairs])
    singles, out = {}, []
    for case, (jc, tc) in zip(cases, pairs, strict=True):
        name = f"{case['model']} {case['optimizer']} {case['dtype']} N={jc.devices} accum={jc.accum}"
        key = single_of(jc)
        try:
            if key not in singles:
                singles[key] = _trace(pair_runs.run_jax(key))
                out.append(log(_across(f"{name.split(' N=')[0]} single jaxdp~torch_ref", singles[key],
                                       torch.get(single_of(tc)))))
            mine = _trace(pair_runs.run_jax(jc))
        except ConfigError as e:  # refused before any step (e.g. the -jit strategies and BatchNorm): not a run
            print(f"refused: {name} {jc.strategy}: {e}", flush=True)
            continue
        except Exception as e:  # noqa: BLE001 (a run that cannot be made is reported, not judged)
            out.append(log(Record(f"{name} {jc.strategy}: jaxdp run", False, failures=[f"run failed: {e!r}"])))
            continue
        out.append(log(judged(f"{name} jaxdp {jc.strategy}~single", mine, singles[key])))
        out.append(log(_across(f"{name} torch_ref {tc.strategy}~single", torch.get(tc), torch.get(single_of(tc)))))
        out.append(log(_across(f"{name} jaxdp {jc.strategy}~torch_ref {tc.strategy}", mine, torch.get(tc))))
    return out


def _across(label: str, a, b) -> Record:
    if a is None or b is None:
        return Record(label, False, failures=["run failed (its torch_ref world)"])
    return judged(label, a, b)


def hf(cases: list, log, promote: bool = False) -> list[Record]:
    """Every hf case against the same model, optimizer and dtype under torch_ref's `single` (N = 1's world)."""
    from torch_ref import launch

    steps = BASE.steps
    for c in cases:
        c["steps"] = steps
    refs = {(c["model"], c["optimizer"], c["dtype"]) for c in cases}
    singles = [dict(model=m, optimizer=o, dtype=d, strategy="single", devices=1, steps=steps) for m, o, d in refs]
    traces = {}
    for n in (1, 2, 3, 4):
        world = [c for c in cases if c["devices"] == n] + (singles if n == 1 else [])
        try:
            done = launch.launch(hf_honest.run_world, n, world, promote, timeout_s=1800, pg_timeout_s=120)[0]
        except Exception as e:  # noqa: BLE001 (reported per case)
            print(f"transformers world N={n} failed: {e}", flush=True)
            continue
        traces |= {_hf_key(c): trace.Trace(*r) for c, r in zip(world, done, strict=True)}
    out = []
    for c in cases:
        ref = traces.get(_hf_key(dict(c, strategy="single", devices=1)))
        label = f"hf-{c['model']} {c['optimizer']} {c['dtype']} N={c['devices']} torch_ref {c['strategy']}~single"
        out.append(log(_across(label, traces.get(_hf_key(c)), ref)))
    return out


def _hf_key(c: dict) -> tuple:
    return c["model"], c["optimizer"], c["dtype"], c["strategy"], c["devices"]


def results(records: list[Record], wall_s: float, command: str, promote: bool) -> dict:
    """The results file's JSON: every comparison and the summary (`honest_render.summarise`)."""
    comparisons = [{"case": r.label, "ok": r.ok, "ratios": r.ratios, "failures": r.failures} for r in records]
    sets = {"project": sum(not r.label.startswith("hf-") for r in records),
            "hf": sum(r.label.startswith("hf-") for r in records)}
    return {"command": command, "wall_s": round(wall_s, 1), "machine": f"{len(os.sched_getaffinity(0))} CPU cores",
            "promote": promote, "families": list(hf_models.FAMILIES), "sets": sets,
            "summary": honest_render.summarise(comparisons, list(MEASURES)), "comparisons": comparisons}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.mutations.honest",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="the first 3 cases of each set (a smoke test)")
    parser.add_argument("--parts", default="project,hf", help="project, hf or both (comma separated)")
    parser.add_argument("--models", default="", help="only these models (comma separated; default: all)")
    parser.add_argument("--dtypes", default="", help="only these dtypes (comma separated; default: all)")
    parser.add_argument("--only-failed", default="", metavar="FILE",
                        help="only the cases a results file (--results) lists as failed")
    parser.add_argument("--jsonl", default="", help="append each comparison to this file as it is judged")
    parser.add_argument("--results", default="", help="write the results file (JSON) here at the end")
    parser.add_argument("--promote", action=argparse.BooleanOptionalAction, default=PROMOTE,
                        help="float64 transformers models with their float32 sites promoted (hf_honest.promoted_sites)")
    args = parser.parse_args(argv)
    import jax

    jax.config.update("jax_num_cpu_devices", 8)
    jax.config.update("jax_enable_x64", True)
    start, records = time.time(), []

    def log(r: Record) -> Record:
        if args.jsonl:
            with open(args.jsonl, "a") as f:
                f.write(json.dumps(r.__dict__) + "\n")
        return r

    parts, wanted = args.parts.split(","), set(filter(None, args.models.split(",")))
    dtypes, failed = set(filter(None, args.dtypes.split(","))), failed_cases(args.only_failed)

    def chosen(cases):
        return [c for c in cases if (not wanted or c["model"] in wanted) and (not dtypes or c["dtype"] in dtypes)
                and (failed is None or _failed(c, failed))][: 3 if args.quick else None]

    command = "python -m tests.mutations.honest " + " ".join(argv if argv is not None else sys.argv[1:])
    out = results(records, 0.0, command, args.promote)
    for part, run in (("hf", lambda: hf(chosen(covering(HF)), log, args.promote)),
                      ("project", lambda: project(chosen(covering(PROJECT, accepted)), log))):
        if part in parts:
            records += run()
            out = results(records, time.time() - start, command, args.promote)
            if args.results:  # after each part: a run stopped later keeps the parts done
                atomic.write_json(args.results, out, indent=1)
    print(honest_render.render(out))
    return 0 if all(r.ok for r in records) else 1


def failed_cases(path: str) -> set | None:
    """The labels a results file lists as failed (None without a file: every case)."""
    if not path:
        return None
    with open(path) as f:
        return {c["case"] for c in json.load(f)["comparisons"] if not c["ok"]}


def _failed(case: dict, labels: set) -> bool:
    """Whether any of the case's comparisons is among `labels` (its labels start with model, optimizer, dtype, N)."""
    head = f"{case['model']} {case['optimizer']} {case['dtype']} N={case['devices']} "
    names = (case["strategy"],) if isinstance(case["strategy"], str) else case["strategy"]  # project: (jaxdp, torch)
    return any(label.removeprefix("hf-").startswith(head) and any(f" {n}~" in label or label.endswith(f" {n}")
                                                                  for n in names) for label in labels)


def accepted(case: dict) -> bool:
    """Whether both frameworks accept the project case (hsdp refuses the cnn's BatchNorm)."""
    try:
        configs(case)
        return True
    except ConfigError:
        return False


if __name__ == "__main__":
    raise SystemExit(main())
