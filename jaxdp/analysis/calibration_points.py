"""The calibration points of the projection, in one table: `python -m jaxdp.analysis.calibration_points`.

Every GPU measurement the project has (docs/BENCHMARKS.md, "On a real GPU": GPT-2 124M on one H100, mirrored
kernels, at micro-batch 8, 16 and 32) and published runs with their configuration and source, each beside the
projection of the same configuration compiled for H100s here (`program_cache`: compiled once, then read back):
projected, reference, and the residual (projected / reference - 1). Targets (tests/jaxdp/analysis/
test_calibration.py): every project-measured point within 15%; a published point within 20% where its
configuration is matched (else excluded, with the reason); Llama 3 8B zero3 keeping 85% or more of its per-GPU
throughput from 8 GPUs to 16 on 2 nodes. The command refits `calibration`'s fitted constants on the step points
(`fit`: least squares of the log residuals on a grid) and says where the code's differ, writes the table
(jaxdp/assets/calibration.json, whose residuals give every projection its range) and renders it into
docs/GPU.md between its markers.
"""
from __future__ import annotations

import functools
import math
import os
import sys
from typing import NamedTuple

from ..core.errors import ConfigError
from ..core.files import atomic
from ..core.registry import strategies as registry
from ..core.run import targets
from ..core.run.config import RunConfig
from . import calibration

TARGET = "h100"
GPT2 = RunConfig(preset="gpt2-124m", dtype="bfloat16", devices=1)
LLAMA = RunConfig(preset="llama3-8b", dtype="bfloat16", strategy=registry.FULLY_SHARDED)
BENCH = "docs/BENCHMARKS.md, 'On a real GPU': one H100 80GB HBM3 SXM, jax 0.11.2, "


class Point(NamedTuple):
    name: str
    kind: str       # step (seconds per step), scaling (per-GPU throughput kept), target, published
    cfg: RunConfig | None
    nodes: int
    reference: float
    unit: str
    source: str
    tolerance: float | None  # the residual allowed; None: a bound (target) or excluded
    excluded: str = ""       # why a published point is not held to the tolerance
    to: tuple = ()           # scaling: (devices, nodes) the throughput kept is projected to
    compiled_to: bool = False  # scaling: `to` compiled as its own program (else the collectives rescaled)


POINTS = (
    Point("gpt2-124m-mb8", "step", GPT2.replace(strategy=registry.REPLICATED, batch_size=8), 1, 0.0340, "s",
          BENCH + "scripts/gpu/aot.py ddp 8 gpu 12 8: ddp on one GPU (XLA removes the all-reduce), median of 5 steps",
          0.15),
    Point("gpt2-124m-mb16", "step", GPT2.replace(strategy=registry.ONE_DEVICE, batch_size=16), 1, 0.0677, "s",
          BENCH + "scripts/gpu/throughput.py jax 16: single, median of the last 10 of 12 steps", 0.15),
    Point("gpt2-124m-mb32", "step", GPT2.replace(strategy=registry.ONE_DEVICE, batch_size=32), 1, 0.1245, "s",
          BENCH + "scripts/gpu/throughput.py jax 32: single, median of the last 10 of 12 steps", 0.15),
    Point("fsdp2-llama3-8b-8-to-128", "scaling", LLAMA.replace(devices=8, batch_size=64), 1, 5605 / 5762,
          "per-GPU throughput kept", "pytorch/torchtitan docs/performance.md, Tables 1 and 3: Llama 3.1 8B, FSDP, "
          "local batch 2 x 8192 tokens, selective AC, H100s of Grand Teton (8 per host, 400 Gb/s per GPU): 5,762 "
          "tokens/s/GPU on 8, 5,605 on 128 (97.3%). Matched: model, full sharding, weak scaling, 16,384 tokens per "
          "GPU per step (here 8 rows of 2048, whose compiled peak, 137 GiB, needs the activation checkpointing "
          "torchtitan uses to fit: projected all the same); projected: the 8-GPU program, its collectives over 128 "
          "GPUs on 16 nodes", 0.20, to=(128, 16)),
    Point("zero3-llama3-8b-8-to-16", "target", LLAMA.replace(devices=8, batch_size=8), 1, 0.85,
          "per-GPU throughput kept (at least)", "the target: FSDP keeps about 97% from 8 to 128 H100s "
          "(torchtitan), so 2 nodes must not cost zero3 more than 15%; both programs compiled (1 row of 2048 per "
          "GPU, the docs' example)", None, to=(16, 2), compiled_to=True),
    Point("torchtitan-llama3-8b-8", "published", LLAMA.replace(devices=8, batch_size=64), 1, 5762, "tokens/s/GPU",
          "pytorch/torchtitan docs/performance.md, Table 1: Llama 3.1 8B, FSDP, 8 H100s, local batch 2 x 8192, "
          "5,762 tokens/s/GPU (33-39% MFU with or without torch.compile)", None,
          excluded="not matched: sequence 8192 (here 2048), flash attention (here the mirrored fp32 attention), "
          "selective activation checkpointing, H100s at 500 W with 96 GB HBM2e at 2.4 TB/s (here 700 W, 3.35 TB/s)"),
    Point("maxtext-llama2-70b-64", "published", None, 8, 460.48, "TFLOP/s per GPU",
          "NVIDIA DGXC Benchmarking, 'Maxtext Llama2 70B 25.01.1' (NGC catalog): 64 H100s, BF16, sequence 4096, "
          "global batch 128: 460.48 TFLOP/s per device (46.6% of 989), 1,036 tokens/s per device", None,
          excluded="not projected: no Llama 2 70B preset here, and 70B needs more than data parallelism on 64 GPUs"),
)


@functools.cache
def _program(cfg, nodes: int) -> tuple[dict, list]:
    from . import inspect, program_cache

    out, found, _ = program_cache.compiled(cfg.validate(), TARGET, nodes, inspect._read_target)
    return out, found


def _step(cfg, nodes: int, eff: dict | None = None, scale_to=None) -> float:
    out, found = _program(cfg, nodes)
    t = targets.TARGETS[TARGET]
    peak = t.peak_flops * (1.0 if cfg.dtype == "bfloat16" else 0.5)
    compute = sum(calibration.compute_seconds(found, t, cfg.dtype, eff).values())
    _, exposed = calibration.comm_seconds([{**c, "devices": cfg.devices} for c in out["collectives"]], t, peak,
                                          scale_to)
    return compute + exposed


def projected(p: Point, eff: dict | None = None) -> float | None:
    """The projection of point `p`'s configuration in its unit (None: not projected)."""
    if p.cfg is None:
        return None
    if p.kind == "step":
        return _step(p.cfg, p.nodes, eff)
    if p.kind == "published":
        return p.cfg.batch_size * p.cfg.seq_len / p.cfg.devices / _step(p.cfg, p.nodes, eff)
    base = _step(p.cfg, p.nodes, eff)
    if p.compiled_to:
        wide = p.cfg.replace(devices=p.to[0], batch_size=p.cfg.batch_size * p.to[0] // p.cfg.devices)
        return base / _step(wide, p.to[1], eff)
    return base / _step(p.cfg, p.nodes, eff, scale_to=p.to)


def fit() -> dict:
    """The fitted constants: memory_efficiency and launch_s minimising the squared log residuals of the step
    points, on a grid of 0.01 and 0.5 us."""
    steps = [p for p in POINTS if p.kind == "step"]
    best = None
    for memory in (m / 100 for m in range(30, 101)):
        for launch in (k * 0.5e-6 for k in range(0, 31)):
            eff = {"memory": memory, "launch": launch}
            loss = sum(math.log(p.reference / projected(p, eff)) ** 2 for p in steps)
            if best is None or loss < best[0]:
                best = (loss, memory, launch)
    return {"memory_efficiency": best[1], "launch_s": best[2]}


def table() -> dict:
    """Every point with its projection, residual and verdict, the constants and the fit."""
    rows = []
    for p in POINTS:
        value = projected(p)
        residual = value / p.reference - 1 if value else None
        ok = (value >= p.reference if p.kind == "target" else
              abs(residual) <= p.tolerance if p.tolerance is not None and residual is not None else None)
        rows.append({"name": p.name, "kind": p.kind, "projected": value, "reference": p.reference, "unit": p.unit,
                     "residual": residual, "ratio": p.reference / value if value and p.kind != "target" else None,
                     "tolerance": p.tolerance, "ok": ok, "included": p.kind in ("step", "scaling"),
                     "excluded": p.excluded, "source": p.source, "nodes": p.nodes,
                     "config": None if p.cfg is None else {k: getattr(p.cfg, k) for k in (
                         "model", "strategy", "devices", "batch_size", "seq_len", "dtype", "kernels")}})
    constants = {k: {"value": v, "how": how, "source": src} for k, (v, how, src) in calibration.CONSTANTS.items()}
    return {"target": TARGET, "points": rows, "constants": constants, "fit": fit(),
            "command": "python -m jaxdp.analysis.calibration_points"}


def _value(v: float | None, unit: str) -> str:
    if v is None:
        return "-"
    return f"{v * 1e3:.1f} ms" if unit == "s" else f"{v:.1%}" if "kept" in unit else f"{v:,.0f}"


def markdown(t: dict) -> str:
    lines = ["| point | kind | projected | reference | residual | target | verdict |",
             "|---|---|---:|---:|---:|---|---|"]
    for r in t["points"]:
        target = (f"within {r['tolerance']:.0%}" if r["tolerance"] is not None else
                  f">= {r['reference']:.0%}" if r["kind"] == "target" else "excluded")
        verdict = "-" if r["ok"] is None else "ok" if r["ok"] else "MISSED"
        residual = "-" if r["residual"] is None else f"{r['residual']:+.1%}"
        lines.append(f"| {r['name']} | {r['kind']} | {_value(r['projected'], r['unit'])} | "
                     f"{_value(r['reference'], r['unit'])} | {residual} | {target} | {verdict} |")
    lines += [""] + [f"- {r['name']}: {r['source']}" + (f". Excluded: {r['excluded']}" if r["excluded"] else "")
                     for r in t["points"]]
    return "\n".join(lines)


MARKS = ("<!-- calibration-table -->", "<!-- /calibration-table -->")


def render(docs: str, t: dict) -> None:
    """Put the table between MARKS in `docs` (left alone where the markers are missing)."""
    with open(docs, encoding="utf-8") as f:
        text = f.read()
    if MARKS[0] not in text or MARKS[1] not in text:
        return
    head, rest = text.split(MARKS[0], 1)
    atomic.write_text(docs, head + MARKS[0] + "\n" + markdown(t) + "\n" + MARKS[1] + rest.split(MARKS[1], 1)[1])


def main(argv: list[str]) -> int:
    """The command: `[OUT.json]` (default: the package's jaxdp/assets/calibration.json, then docs/GPU.md's table
    too); exit 0 when every point meets its target, 1 when one misses, 2 on bad input."""
    if len(argv) > 1 or (argv and not argv[0].endswith(".json")):
        raise ConfigError(f"calibration_points takes one optional argument, the results file: got {' '.join(argv)!r}"
                          f"; give a path ending in .json (default: {calibration.RESULTS})")
    out = argv[0] if argv else calibration.RESULTS
    targets.require_extra()
    t = table()
    atomic.write_json(out, t, indent=1)
    if out == calibration.RESULTS and os.path.isfile("docs/GPU.md"):
        render("docs/GPU.md", t)
    print(markdown(t))
    code = {k: calibration.CONSTANTS[k][0] for k in t["fit"]}
    if any(abs(code[k] - v) > 1e-9 for k, v in t["fit"].items()):
        print(f"the fit differs from calibration.py's constants: {t['fit']} (code: {code})")
    print(f"wrote {out}")
    return 0 if all(r["ok"] is not False for r in t["points"]) else 1


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except ConfigError as e:
        print(e, file=sys.stderr)
        sys.exit(2)
