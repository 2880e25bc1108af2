"""A step time projected from the compiled GPU program (`--target`): a projection, never a measurement.

XLA's `cost_analysis()` gives nothing for a program compiled for a topology (None in jaxlib 0.10.2), so the
program is read instead (`schedule`): its matrix-product FLOPs per device, and its HBM traffic (each kernel of
the scheduled program writes its result and reads what it uses of its operands once: a fusion the elements its
computation draws from each, `fusion_reads`; `hbm_bytes`). Then
  compute  = max(FLOPs / peak FLOP/s, HBM bytes / HBM bandwidth)        (a roofline per step, not per kernel)
  comm     = sum over collectives of bytes sent per device x trips / a ring's bus bandwidth: NVLink when
             every group of the collective lies within a node, else the NICs its GPUs drive (network.py)
  exposed  = per collective, its time less the compute scheduled under it (`overlap_flops` / peak), >= 0;
             all of it for a collective run synchronously
  step     = compute + exposed
  MFU      = model FLOPs / (step x peak), model FLOPs per device = (6 Psi + 12 L d T) tokens / N (PaLM's
             count: the parameters' and attention's matrix products, forward and backward); for the mlp
             and cnn 6 Psi x rows / N.
Peak is the dense bf16 tensor-core rate (float32 programs: TF32's, half of it). Unmodelled: kernel launch
and NCCL latency, stragglers, autotuned kernels' efficiency (every kernel is taken at peak), the
optimizer's elementwise FLOPs; so the projection is an upper bound on what the hardware allows.
"""
from __future__ import annotations

from . import fusion_reads, hlo, network, schedule

KERNEL_FREE = schedule.FREE + ("while", "conditional", "call", "after-all")


def hbm_bytes(hlo_text: str) -> float:
    """Bytes the program's kernels read and write: for each instruction of the entry computation and of the
    loops it runs (times their trips), `_kernel`'s bytes (tuple plumbing, bitcasts and the collectives' done
    halves free)."""
    entry, comps = hlo.computations(hlo_text)
    memo: dict[str, float] = {}
    fused: dict[str, tuple[list[float], float]] = {}

    def of(name: str, depth: int) -> float:
        if name in memo or depth > 32:
            return memo.get(name, 0.0)
        defs = schedule.defs(comps.get(name, []))
        shapes = {n: s for n, s, _, _ in defs}
        total = 0.0
        for _, shape, op, line in defs:
            if op == "while":
                body = [b for a, b in hlo.CALLS.findall(line) if a == "body"]
                trips = hlo.trip_count(line) or 1
                total += trips * sum(of(b.lstrip("%"), depth + 1) for b in body)
            elif op not in KERNEL_FREE and not op.endswith("-done"):
                total += _kernel(op, shape, line, shapes, comps, fused)
        memo[name] = total
        return total

    return of(entry, 0)


def _kernel(op: str, shape: str, line: str, shapes: dict[str, str], comps: dict, fused: dict) -> float:
    """One kernel's bytes: a fusion's as `fusion_reads` reads its computation (memoised in `fused`); an unfused
    dynamic-update-slice in place (its update read and written); anything else its result and operands whole."""
    names = fusion_reads.operands(line, op)
    if op == "fusion" and (called := hlo.CALLS.search(line)) and called.group(2).lstrip("%") in comps:
        name = called.group(2).lstrip("%")
        if name not in fused:
            fused[name] = fusion_reads.traffic(comps[name])
        reads, written = fused[name]
        return written + sum(min(r, _bytes(shapes.get(a, ""))) for r, a in zip(reads, names, strict=False))
    if op == "dynamic-update-slice" and len(names) > 1:
        return 2 * _bytes(shapes.get(names[1], ""))
    return _bytes(shape) + sum(_bytes(shapes.get(a, "")) for a in names)


def _bytes(shape: str) -> float:
    return float(sum(hlo.DTYPE_BYTES[d] * e for d, e in hlo.arrays_of(shape)))


def model_flops(cfg, psi: int) -> float:
    """Model FLOPs per device per step (PaLM's count; see the module docstring)."""
    if cfg.model in ("gpt", "gpt2", "llama"):
        tokens = cfg.batch_size * cfg.seq_len
        return (6 * psi + 12 * cfg.n_layer * cfg.d_model * cfg.seq_len) * tokens / cfg.devices
    return 6 * psi * cfg.batch_size / cfg.devices


def project(r: dict, target, text: str, psi: int, cfg) -> dict:
    """The projection for inspect's target dictionary `r` (its collectives with `overlap_flops` and
    `inter_node`) on `target` (`core.targets.Target`)."""
    peak = target.peak_flops * (1.0 if cfg.dtype == "bfloat16" else 0.5)
    traffic = hbm_bytes(text)
    compute = max(r["step_flops"] / peak, traffic / target.hbm_bytes_s)
    comm = exposed = 0.0
    for c in r["collectives"]:
        nodes = c.get("nodes", 2 if c["inter_node"] else 1)  # a ring over every NIC of its nodes (network.py)
        link = network.bus_bytes_s(c.get("group_size", 8 * nodes), nodes, network.fabric(target))
        seconds = c["bytes_per_device"] * (c["trips"] or 1) / link
        comm += seconds
        hidden = c["overlap_flops"] * (c["trips"] or 1) / peak if c["async"] else 0.0
        exposed += max(0.0, seconds - hidden)
    step = compute + exposed
    useful = model_flops(cfg, psi)
    return {"projected": True, "peak_flops": peak, "hbm_bytes": traffic, "compute_s": compute, "comm_s": comm,
            "exposed_comm_s": exposed, "step_s": step, "mfu": useful / (step * peak) if step else 0.0,
            "model_flops": useful, "tokens_per_s": (cfg.batch_size * cfg.tokens_per_row()) / step if step else 0.0}
