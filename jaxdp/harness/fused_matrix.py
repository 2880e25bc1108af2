"""The judge on the fused path, every configuration (docs/KERNELS.md, "Why the numerics differ"): for gpt2 (tied
head, fused qkv with bias) and llama (grouped-query heads), float32 and bf16, N in {1, 2, 4} and every strategy of
each framework (`config.FRAMEWORK_STRATEGIES`), three pairs judged by `jaxdp.parity.judge`:

  jax fused/mirrored      jaxdp --kernels fused against jaxdp --kernels mirrored (same strategy)
  torch fused/mirrored    torch_ref fused against torch_ref mirrored
  jax/torch fused         jaxdp fused against torch_ref fused (the strategies both frameworks have)

    python -m jaxdp.harness.fused_matrix --out docs/fused_matrix.json   # the whole matrix (~30 min on 2 cores)
    python -m jaxdp.harness.fused_matrix --render docs/KERNELS.md      # its table into the page, from the file

Each pair's JSON row holds its worst measures, the worst tensor of each, the derived bounds' worst ratio and the
verdict. jaxdp runs in this process (4 simulated CPU devices), torch_ref in one spawned world per N running all of
that N's configurations (`pair_runs.run_torch`). tests/jaxdp/harness/test_fused_matrix.py runs a sample of it.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import dataclass

from ..core.files import atomic
from ..core.registry import strategies as registry
from ..core.run.config import FRAMEWORK_STRATEGIES, RunConfig
from ..core.run.hsdp_hosts import per_strategy
from ..core.traces import trace as trace_mod

# The user's defaults (AdamW, lr 1e-3, no weight decay) on tiny models: one layer, width 32, context 16, 3 steps.
GPT2 = RunConfig(model="gpt2", data="text", n_layer=1, n_head=2, d_model=32, seq_len=16, batch_size=8, steps=3,
                 seed=11)
LLAMA = GPT2.replace(model="llama", n_head=4, n_kv_head=2, d_ff=64)
MODELS = {"gpt2": GPT2, "llama": LLAMA}
DTYPES = ("float32", "bfloat16")
DEVICES = (1, 2, 4)
KINDS = ("jax fused/mirrored", "torch fused/mirrored", "jax/torch fused")
FIELDS = ("loss", "grad", "param", "update", "step update")
# the strategies judged against `single`'s training (a row whose oracle is another, diloco's, has its own tests)
JUDGED = set(registry.names(oracle="single"))
BOTH = [s for s in FRAMEWORK_STRATEGIES["jax"] if s in FRAMEWORK_STRATEGIES["torch"] and s in JUDGED]


@dataclass(frozen=True)
class Pair:
    """Trace a (`a_side`: 'jax' or 'torch', its RunConfig) judged against reference b."""
    kind: str
    strategy: str
    a_side: str
    a: RunConfig
    b_side: str
    b: RunConfig


def config(base: RunConfig, framework: str, strategy: str, n: int, dtype: str, kernels: str) -> RunConfig:
    """One side's configuration, validated: `single` on one device; hsdp as R = 2 groups where N > 1."""
    cfg = base.replace(devices=1 if registry.on_one_device(strategy) else n, dtype=dtype, kernels=kernels,
                       replicas=2 if registry.entry(strategy).grid and n > 1 else 1)
    return per_strategy(cfg, strategy).validate(framework)


def strategies(framework: str, n: int) -> list[str]:
    return [s for s in FRAMEWORK_STRATEGIES[framework] if s in JUDGED and (n == 1 or not registry.on_one_device(s))]


def pairs(base: RunConfig, n: int, dtype: str, kinds=KINDS) -> list[Pair]:
    """The pairs of one model, N and dtype."""
    out = []
    for framework, kind in (("jax", KINDS[0]), ("torch", KINDS[1])):
        if kind in kinds:
            out += [Pair(kind, s, framework, config(base, framework, s, n, dtype, "fused"), framework,
                         config(base, framework, s, n, dtype, "mirrored")) for s in strategies(framework, n)]
    if KINDS[2] in kinds:
        out += [Pair(KINDS[2], s, "jax", config(base, "jax", s, n, dtype, "fused"), "torch",
                     config(base, "torch", s, n, dtype, "fused"))
                for s in BOTH if n == 1 or not registry.on_one_device(s)]
    return out


def matrix(models=tuple(MODELS), dtypes=DTYPES, devices=DEVICES, kinds=KINDS) -> list[Pair]:
    return [p for m in models for d in dtypes for n in devices for p in pairs(MODELS[m], n, d, kinds)]


def judged(pair: Pair, a, b) -> dict:
    """One JSON row: `pair` judged (a and b: RunResults or Traces)."""
    from ..judge import parity

    ta, tb = (trace_mod.Trace(r.meta, r.arrays) for r in (a, b))
    row = parity.judge(ta, tb, sides=(f"{pair.a_side} {pair.a.kernels}", f"{pair.b_side} {pair.b.kernels}"))
    from ..judge.resolution import MEASURES

    res = row.resolution
    derived = {m: round(w.ratio, 4) for m in MEASURES if res is not None and (w := res.worst(m)) is not None}
    return {"kind": pair.kind, "model": pair.b.model, "dtype": pair.b.dtype, "devices": pair.a.devices,
            "strategy": pair.strategy, "a": f"{pair.a_side} {pair.a.strategy} {pair.a.kernels}",
            "b": f"{pair.b_side} {pair.b.strategy} {pair.b.kernels}",
            "worst": {f: _finite(row.worst[f]) for f in FIELDS}, "worst_key": {f: row.worst_key.get(f, "") for f in
                                                                                FIELDS},
            "bounds": {f: _finite(row.tol.bound(f)) for f in FIELDS}, "derived": derived,
            "relaxed": len(row.relaxed), "ok": row.ok, "failures": list(row.failures)}


def _finite(x: float):
    return x if math.isfinite(x) else None


def run(todo: list[Pair], log=None) -> list[dict]:
    """Train every side of `todo` once (torch: one world per N) and judge each pair."""
    from . import pair_runs

    torch_cfgs = list(dict.fromkeys(c for p in todo for side, c in ((p.a_side, p.a), (p.b_side, p.b))
                                    if side == "torch"))
    t0 = time.perf_counter()
    torch_results = pair_runs.run_torch(torch_cfgs) if torch_cfgs else {}
    _say(log, f"torch: {len(torch_cfgs)} runs in {time.perf_counter() - t0:.0f} s")
    jax_results: dict = {}

    def result(side, cfg):
        if side == "torch":
            return torch_results[cfg]
        if cfg not in jax_results:
            jax_results[cfg] = pair_runs.run_jax(cfg)
        return jax_results[cfg]

    rows = []
    for p in todo:
        rows.append(judged(p, result(p.a_side, p.a), result(p.b_side, p.b)))
        _say(log, f"{p.kind:<22} {p.b.model:<6} {p.b.dtype:<9} N={p.a.devices} {p.strategy:<10} "
                  f"{'ok' if rows[-1]['ok'] else 'MISMATCH: ' + '; '.join(rows[-1]['failures'])}")
    _say(log, f"jax: {len(jax_results)} runs; all in {time.perf_counter() - t0:.0f} s")
    return rows


def _say(log, line: str) -> None:
    if log is not None:
        print(line, file=log, flush=True)


def worst(rows: list[dict]) -> dict:
    """{(kind, dtype): {field: (worst value, where)}} over `rows`."""
    out: dict = {}
    for r in rows:
        cell = out.setdefault((r["kind"], r["dtype"]), {})
        for f in FIELDS:
            v = r["worst"][f]
            if v is not None and v > cell.get(f, (-1.0, ""))[0]:
                cell[f] = (v, f"{r['model']} {r['strategy']} N={r['devices']} {r['worst_key'][f]}")
    return out


def merged(paths: list[str]) -> dict:
    """One results document from slices of the matrix (run one after another or side by side): the rows in
    the matrix's order, the slices' commands and seconds."""
    docs = []
    for path in paths:
        with open(path) as f:
            docs.append(json.load(f))
    order = {(p.kind, p.b.model, p.b.dtype, p.a.devices, p.strategy): i for i, p in enumerate(matrix())}
    rows = sorted((r for d in docs for r in d["rows"]),
                  key=lambda r: order.get((r["kind"], r["model"], r["dtype"], r["devices"], r["strategy"]), -1))
    return {"command": "python -m jaxdp.harness.fused_matrix", "seconds": sum(d["seconds"] for d in docs),
            "slices": [d["command"] for d in docs], "configs": {k: v for d in docs for k, v in d["configs"].items()},
            "rows": rows}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jaxdp.harness.fused_matrix", description=__doc__.split("\n")[0])
    parser.add_argument("--out", help="write every pair's row (JSON) here")
    parser.add_argument("--render", help="a markdown page whose fused-matrix section is rewritten from --results")
    parser.add_argument("--results", default="docs/fused_matrix.json", help="the JSON --render reads")
    parser.add_argument("--merge", nargs="+", help="results files of slices (--models/--dtypes/--devices runs) "
                        "to merge into --out as one matrix")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--dtypes", default=",".join(DTYPES))
    parser.add_argument("--devices", default=",".join(map(str, DEVICES)))
    args = parser.parse_args(argv)
    if args.render:
        from . import fused_matrix_doc

        with open(args.results) as f:
            fused_matrix_doc.write(args.render, json.load(f))
        return 0
    if args.merge and args.out:
        atomic.write_json(args.out, merged(args.merge), indent=1)
        return 0
    models, dtypes = args.models.split(","), args.dtypes.split(",")
    devices = [int(n) for n in args.devices.split(",")]
    bad = [m for m in models if m not in MODELS] + [d for d in dtypes if d not in DTYPES] + [
        str(n) for n in devices if n not in DEVICES]
    if bad or not args.out:
        print(f"fused_matrix: --out is required; models {', '.join(MODELS)}, dtypes {', '.join(DTYPES)}, devices "
              f"{', '.join(map(str, DEVICES))} (got {', '.join(bad) or 'no --out'})", file=sys.stderr)
        return 2
    from .. import devices as devices_mod

    devices_mod.request_cpu_devices(max(devices))
    t0 = time.perf_counter()
    rows = run(matrix(models, dtypes, devices), log=sys.stdout)
    doc = {"command": "python -m jaxdp.harness.fused_matrix " + " ".join(argv if argv is not None else sys.argv[1:]),
           "seconds": round(time.perf_counter() - t0), "configs": {m: MODELS[m].to_dict() for m in models},
           "rows": rows}
    atomic.write_json(args.out, doc, indent=1)
    failed = [r for r in rows if not r["ok"]]
    print(f"{len(rows)} pairs, {len(failed)} failed; written to {args.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
