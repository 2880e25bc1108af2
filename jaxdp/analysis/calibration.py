"""The calibrated projection of a compiled GPU program: per-kernel compute with per-kind efficiencies, the network
as built (`network`), and the range its calibration points give (docs/GPU.md, "Projected step time").

  compute  = sum over the program's kernels (`kernels.read`) of its time, by kind:
               gemm       max(FLOPs / (peak x GEMM_EFFICIENCY), bytes / (HBM x MEMORY_EFFICIENCY))
               attention  max(FLOPs / (peak x ATTENTION_EFFICIENCY), bytes / (HBM x MEMORY_EFFICIENCY))
               fusion     bytes / (HBM x MEMORY_EFFICIENCY)          (memory-bound)
               copy       bytes / (HBM x MEMORY_EFFICIENCY)
             + LAUNCH_S per kernel (the GPU idle between kernels)
  comm     = per collective, `network.seconds` (NCCL's ring or tree over NVLink and the node's NICs) x trips
  exposed  = per collective, its time less its overlapped compute's (`overlap_flops` / (peak x GEMM_EFFICIENCY)),
             >= 0; all of it for a collective run synchronously
  step     = compute + exposed
Each constant is sourced or fitted (CONSTANTS says which, and on what); `python -m jaxdp.analysis.calibration_points`
refits the fitted ones and writes the table of calibration points (jaxdp/assets/calibration.json), whose
residuals give each projection its range (`error_range`).
"""
from __future__ import annotations

import json
import math
import os

from . import kernels, network

GEMM_EFFICIENCY = 0.801  # sourced: 792.1 of 989 TFLOP/s, H100 SXM bf16 matmul at its best shape (CUDA 12.1)
ATTENTION_EFFICIENCY = 0.75  # sourced: FlashAttention-3 forward, 740 TFLOP/s bf16/fp16 on H100 (75%)
MEMORY_EFFICIENCY = 0.68  # fitted: GPT-2 124M on one H100 at micro-batch 8, 16, 32 (calibration_points.fit)
LAUNCH_S = 1.5e-6  # fitted with MEMORY_EFFICIENCY on the same points

CONSTANTS = {
    "gemm_efficiency": (GEMM_EFFICIENCY, "sourced", "stas00/ml-engineering, compute/accelerator/README.md, 'Maximum "
                        "Achievable Matmul FLOPS comparison table': H100 SXM 792.1 of 989 TFLOP/s (80.1%), bf16, "
                        "CUDA 12.1, best shape 6144x17920x2816; XLA's GEMM fusions at other shapes may be slower"),
    "attention_efficiency": (ATTENTION_EFFICIENCY, "sourced", "FlashAttention-3 (arXiv 2407.08608): up to 740 TFLOP/s "
                             "(75% utilization) in FP16 on H100, forward; not checked on a measured point here"),
    "memory_efficiency": (MEMORY_EFFICIENCY, "fitted", "fraction of the 3.35 TB/s HBM3 datasheet bandwidth the "
                          "memory-bound kernels reach, fitted on the project's GPT-2 124M points (mirrored kernels)"),
    "launch_s": (LAUNCH_S, "fitted", "seconds the GPU idles per kernel, fitted with memory_efficiency; the project's "
                 "profile gives 7.8 ms idle over about 1,030 kernels at micro-batch 16 (7.6 us per kernel)"),
    "network": (None, "sourced", network.__doc__.split("\n\n", 1)[0]),
}
RESULTS = os.path.join(os.path.dirname(os.path.dirname(__file__)), "assets", "calibration.json")


def compute_seconds(found: list[list], target, dtype: str, eff: dict | None = None) -> dict:
    """{kind: seconds per step} of `kernels.read`'s kernels on `target`, and `launch` (see the module docstring);
    `eff` overrides the efficiencies (the fit)."""
    e = {"gemm": GEMM_EFFICIENCY, "attention": ATTENTION_EFFICIENCY, "memory": MEMORY_EFFICIENCY,
         "launch": LAUNCH_S, **(eff or {})}
    peak = target.peak_flops * (1.0 if dtype == "bfloat16" else 0.5)
    hbm = target.hbm_bytes_s * e["memory"]
    out = {k: 0.0 for k in kernels.KINDS}
    runs = 0.0
    for kind, trips, work, moved in found:
        rate = {"gemm": e["gemm"], "attention": e["attention"]}.get(kind)
        seconds = moved / hbm if rate is None else max(work / (peak * rate), moved / hbm)
        out[kind] += trips * seconds
        runs += trips
    out["launch"] = runs * e["launch"]
    return out


def comm_seconds(collectives: list[dict], target, peak: float, scale_to: tuple[int, int] | None = None) -> tuple:
    """(comm, exposed) seconds per step of inspect's collectives (each with `group_size`, `nodes`, `trips`,
    `async`, `overlap_flops`); `scale_to` (devices, nodes): the same collectives over that many devices instead
    (their ring bytes rescaled, `network.rescaled`): a projection to a cluster not compiled for."""
    f = network.fabric(target)
    comm = exposed = 0.0
    for c in collectives:
        group, nodes, sent = c["group_size"], c.get("nodes", 1), c["bytes_per_device"]
        if scale_to is not None and group > 1:  # the group grows with the cluster, a node holding as many as now
            wider = group * scale_to[0] // c["devices"]
            sent, group = network.rescaled(sent, c["op"], group, wider), wider
            nodes = max(1, wider // (scale_to[0] // scale_to[1]))
        trips = c["trips"] or 1
        seconds = network.seconds(c["op"], sent, group, nodes, f) * trips
        hidden = c["overlap_flops"] * trips / (peak * GEMM_EFFICIENCY) if c["async"] else 0.0
        comm += seconds
        exposed += max(0.0, seconds - hidden)
    return comm, exposed


def project(r: dict, target, found: list[list], model_flops: float, cfg) -> dict:
    """The calibrated projection of inspect's target dictionary `r` with the program's kernels `found`."""
    peak = target.peak_flops * (1.0 if cfg.dtype == "bfloat16" else 0.5)
    parts = compute_seconds(found, target, cfg.dtype)
    compute = sum(parts.values())
    comm, exposed = comm_seconds([{**c, "devices": cfg.devices} for c in r["collectives"]], target, peak)
    step = compute + exposed
    tokens = cfg.batch_size * cfg.tokens_per_row()
    return {"projected": True, "calibrated": True, "peak_flops": peak, "compute_s": compute,
            "compute_by_kind_s": parts, "kernels": kernels.by_kind(found),
            "comm_s": comm, "exposed_comm_s": exposed, "step_s": step,
            "mfu": model_flops / (step * peak) if step else 0.0, "model_flops": model_flops,
            "tokens_per_s": tokens / step if step else 0.0}


def results(path: str = RESULTS) -> dict:
    """The calibration table `calibration_points` wrote (empty where none was written)."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def error_range(step_s: float, devices: int, table: dict | None = None) -> dict:
    """`step_low_s`, `step_high_s`: the step times the calibration's residuals allow (reference / projected step
    time of every included point this projection rests on: the one-GPU step points always, the scaling points
    beside them for several GPUs, whose ratio of throughput kept is inverted: more kept than projected is a
    shorter step), the projection itself inside; `calibrated_on`: those points' names."""
    table = results() if table is None else table
    kinds = ("step",) if devices <= 1 else ("step", "scaling")
    used = [p for p in table.get("points", []) if p["kind"] in kinds and p.get("included") and p.get("ratio")]
    # a step point's ratio is of step times; a scaling point's of throughput kept, whose inverse is the step's
    ratios = [p["ratio"] if p["kind"] == "step" else 1.0 / p["ratio"] for p in used] + [1.0]
    return {"step_low_s": step_s * min(ratios), "step_high_s": step_s * max(ratios),
            "calibrated_on": [p["name"] for p in used]}


PARTS = {"compiled": "the kernels with their FLOPs and bytes, the collectives with their groups and bytes, what runs "
                     "under each collective (XLA:GPU's program and schedule)",
         "measured": "memory_efficiency and launch_s, fitted on the project's GPT-2 124M steps on one H100; the range, "
                     "from the calibration points' residuals",
         "modelled": "each kernel's time from its kind's efficiency, the network (NCCL's ring or tree over NVLink and "
                     "the nodes' NICs: sourced, not measured here)"}


def for_target(out: dict, target, found: list[list], roofline: dict, cfg) -> dict:
    """inspect --target's `projection`: the calibrated one (`project`), its range (`error_range`), which parts
    are compiled, measured and modelled (PARTS), and the uncalibrated roofline beside it (`roofline_step_s`,
    `roofline_mfu`: every kernel at peak, an upper bound)."""
    p = project(out, target, found, roofline["model_flops"], cfg)
    return {**p, "hbm_bytes": roofline["hbm_bytes"], "roofline_step_s": roofline["step_s"],
            "roofline_mfu": roofline["mfu"], **error_range(p["step_s"], cfg.devices), "parts": PARTS}


def reproject(out: dict, target, found: list[list], cfg) -> dict:
    """`for_target` again from a stored projection's roofline (a cached program, `program_cache`)."""
    old = out["projection"]
    roofline = {"model_flops": old["model_flops"], "hbm_bytes": old["hbm_bytes"],
                "step_s": old.get("roofline_step_s", old["step_s"]), "mfu": old.get("roofline_mfu", old["mfu"])}
    return for_target(out, target, found, roofline, cfg)


def figures(low: float, high: float) -> int:
    """The significant figures a range supports: one where its ends differ by more than a fifth, else two."""
    return 1 if high > 1.2 * low else 2


def rounded(x: float, digits: int, way=round) -> str:
    """`x` to `digits` significant figures (`way`: round, math.floor, math.ceil), without an exponent (0.04,
    300, 5800)."""
    if x == 0:
        return "0"
    places = digits - 1 - math.floor(math.log10(abs(x)))
    scaled = x * 10**places
    nudge = {math.floor: 1e-9, math.ceil: -1e-9}.get(way, 0.0)  # 5.999999999 is 6, not 5 (nor 6.000000001 7)
    return f"{way(scaled + nudge) / 10**places:.{max(places, 0)}f}"


def span(low: float, high: float, scale: float = 1.0) -> str:
    """'300-600' (x `scale`): a range to the figures it supports, its low end rounded down and its high end up
    (the printed range holds the computed one); one value where both ends come out alike."""
    digits = figures(low, high)
    a, b = rounded(low * scale, digits, math.floor), rounded(high * scale, digits, math.ceil)
    return a if a == b else f"{a}-{b}"


def summary_line(p: dict) -> str:
    """inspect --target's projection in words: the step and MFU as ranges, what is compiled, measured, modelled."""
    low, high = p["step_low_s"], p["step_high_s"]
    by = p["compute_by_kind_s"]
    on = ", ".join(p["calibrated_on"]) or "no calibration point"
    return (f"PROJECTED (not measured; docs/GPU.md): step {span(low, high, 1e3)} ms (calibrated on {on}), MFU "
            f"{span(p['mfu'] * p['step_s'] / high, p['mfu'] * p['step_s'] / low, 100)}%, "
            f"{span(p['tokens_per_s'] * p['step_s'] / high, p['tokens_per_s'] * p['step_s'] / low)} rows or "
            f"tokens/s; the model's value {p['step_s'] * 1e3:.3g} ms = compute {p['compute_s'] * 1e3:.3g} ms (GEMMs "
            f"{by['gemm'] * 1e3:.3g}, memory-bound fusions {by['fusion'] * 1e3:.3g}, attention "
            f"{by['attention'] * 1e3:.3g}, copies {by['copy'] * 1e3:.3g}, launches {by['launch'] * 1e3:.3g}) + "
            f"exposed communication {p['exposed_comm_s'] * 1e3:.3g} ms (of {p['comm_s'] * 1e3:.3g})\n"
            + "\n".join(f"  {k}: {v}" for k, v in p["parts"].items())
            + f"\n  uncalibrated roofline (every kernel at peak, an upper bound): step {p['roofline_step_s'] * 1e3:.3g}"
              f" ms, MFU {p['roofline_mfu']:.0%}")
