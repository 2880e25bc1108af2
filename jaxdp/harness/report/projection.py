"""Projected scaling: a model of a data-parallel step on N = 8 ... 1024 GPUs (compute at an assumed MFU, NCCL on
the network as built).

What is projected: named reference models (`references`: GPT-2 124M, Llama 3 8B, from their
published shapes), each with every strategy's *measured* bytes per parameter: the bytes a device
sends per step (read from the compiled step's HLO at the run's device count) divided by the run's
parameter count. The run's own model is projected too, with its measured FLOPs per sample (XLA's
cost analysis of the compiled single-device step), only when it is compute-bound (CRITERION): a toy
model's step is a few microseconds of compute against a ring's per-hop latencies, and its projected
efficiencies (around 1e-5) say nothing. Hardware numbers are presets, each with its source.

Model (stated assumptions):
- compute: t_c = FLOPs per sample x samples per device / (peak FLOP/s x MFU);
- communication: at n devices a device sends (n-1)/n of a payload per ring phase, so the payload is recovered
  from the measured bytes and re-scaled to N; a strategy's number of phases is its payload over the parameters'
  bytes (ddp's all-reduce: 2; zero3's reduce-scatter and two gathers: 3), each phase priced by the project's one
  network model (jaxdp/analysis/network.py, `links.collective`): NCCL's ring over N GPUs on N / 8 nodes, on
  NVLink inside a node (450 GB/s) and across nodes on all 8 of a node's 400 Gb/s NICs (400 GB/s a node), with
  NCCL's latencies; hsdp: `links.comm_seconds` (its all-reduce across nodes on one NIC per GPU);
- no overlap of compute and communication (an upper bound on step time);
- reference models: a sample is a sequence of the published context; weak scaling runs one sequence
  per GPU per step (the global batch grows with N), strong scaling splits the published global batch
  (`Transformer.batch_seqs`, 512 sequences for both); the two meet at N = 512, one sequence per GPU;
- weak scaling (per-device batch fixed):  E_weak(N)   = T(1) / T(N);
- strong scaling (global batch fixed):    E_strong(N) = T(1) / (N T(N)), drawn while every GPU holds at
  least one sample (data parallelism cannot split one): for the reference models, up to 512 GPUs.
The seed notes write the two efficiencies with the labels swapped (weak = T1 / (N TN)); we use the standard
definitions, which match the seeds' formulas if T is read as the time of the whole run.
"""
from __future__ import annotations

from dataclasses import asdict

import numpy as np

from ...core.registry import strategies as registry
from . import links, references
from .hardware import H100_NVLINK_IB, NODE_GPUS, PRESETS, Preset, nodes_of  # noqa: F401 (the report's names)

NS = (8, 16, 32, 64, 128, 256, 512, 1024)


def payload_bytes(sent_per_device: float, n_measured: int) -> float:
    """The ring payload behind `sent_per_device` bytes measured at n devices ((n-1)/n of it is sent)."""
    return 0.0 if n_measured <= 1 else sent_per_device * n_measured / (n_measured - 1)


def comm_time(payload: float, n: int, hops_per_payload: float, preset: Preset) -> float:
    """Seconds of `payload` (all phases' together) in `hops_per_payload` ring phases over n GPUs on their n /
    NODE_GPUS nodes, each phase priced as an all-gather by the project's network model (`links.collective`:
    NCCL's ring, NVLink in a node, all of a node's NICs across nodes, NCCL's latencies)."""
    if n <= 1 or payload <= 0:
        return 0.0
    phases = max(hops_per_payload, 1.0)
    return phases * links.collective("all-gather", payload / phases, n, nodes_of(n), preset)


def project(flops_per_sample: float, sent_per_device: float, n_measured: int, samples_per_device: float,
            global_batch: float, preset: Preset = H100_NVLINK_IB, hops_per_payload: float = 2.0, ns=NS,
            comm=None) -> dict:
    """Step times and scaling efficiencies for each N (see the module docstring); strong-scaling values
    are None where a GPU would hold less than one sample of the global batch. `comm`: seconds of
    communication at n, when not a ring over all N (hsdp: `links.comm_seconds`)."""
    flops_s = preset.peak_flops * preset.mfu
    payload = payload_bytes(sent_per_device, n_measured)
    t1_weak = samples_per_device * flops_per_sample / flops_s
    t1_strong = global_batch * flops_per_sample / flops_s
    rows = []
    for n in ns:
        t_comm = comm_time(payload, n, hops_per_payload, preset) if comm is None else comm(n)
        t_weak = t1_weak + t_comm
        t_strong = global_batch / n * flops_per_sample / flops_s + t_comm if global_batch >= n else None
        rows.append({"n": n, "comm_s": t_comm, "weak_step_s": t_weak, "strong_step_s": t_strong,
                     "weak_efficiency": t1_weak / t_weak,
                     "strong_efficiency": None if t_strong is None else t1_strong / (n * t_strong)})
    return {"payload_bytes": payload, "flops_per_sample": flops_per_sample,
            "samples_per_device": samples_per_device, "global_batch": global_batch, "rows": rows}


def bytes_per_param(sent_per_device: float, params: int) -> float:
    """Bytes a device sends per step per parameter of the model, at the measured device count."""
    return sent_per_device / params


def ring_phases(sent_per_device: float, n_measured: int, params: int, itemsize: int) -> float:
    """Parameter-sized ring phases behind the measured bytes (each costs N-1 latency hops)."""
    return payload_bytes(sent_per_device, n_measured) / (params * itemsize)


CRITERION = ("the run's own model is projected only when it is compute-bound: at the smallest projected scale "
             f"({NS[0]} GPUs, the run's per-device batch) its compute time per step is at least the communication "
             "time of every measured strategy (weak efficiency >= 1/2 for all of them)")


def compute_bound(flops_per_sample: float, sent_by_strategy: dict, n_measured: int, samples_per_device: float,
                  phases: dict, preset: Preset = H100_NVLINK_IB) -> dict:
    """CRITERION, with the two times it compares."""
    compute_s = samples_per_device * flops_per_sample / (preset.peak_flops * preset.mfu)
    comm_s = max((comm_time(payload_bytes(b, n_measured), NS[0], phases[s], preset)
                  for s, b in sent_by_strategy.items()), default=0.0)
    return {"compute_bound": bool(sent_by_strategy) and compute_s >= comm_s, "compute_s": compute_s, "comm_s": comm_s}


GRID = registry.names(grid=True)[0]  # hsdp: the strategy over R groups of a node's GPUs, projected across nodes


def reference(model: references.Transformer, bytes_per_param_by_strategy: dict, phases: dict, n_measured: int,
              preset: Preset = H100_NVLINK_IB, itemsize: int = 4) -> dict:
    """One reference model's projection for every strategy, from the strategies' bytes per parameter."""
    p, seqs = references.params(model), model.batch_seqs
    fps = references.flops_per_token(model) * model.context
    strategies = {s: project(fps, bpp * p, n_measured, 1, seqs, preset, phases[s],
                             comm=_two_level(s, p, preset, itemsize))
                  for s, bpp in bytes_per_param_by_strategy.items()}
    if strategies and GRID not in strategies:  # the links model's hsdp: the recommendation's candidate across nodes
        hsdp = project(fps, 0.0, n_measured, 1, seqs, preset, comm=_two_level(GRID, p, preset, itemsize))
        strategies[GRID] = {**hsdp, "projected_only": True}
    return {"params": p, "flops_per_token": references.flops_per_token(model), "context": model.context,
            "batch_seqs": seqs, "source": model.source, "strategies": strategies}


def _two_level(strategy: str, params: int, preset: Preset, itemsize: int):
    """hsdp's communication at n: in-group rings on NVLink, the all-reduce across nodes on one NIC per GPU, in
    the run's dtype (`links`); None (one ring over all N) for the other strategies."""
    if strategy != GRID:
        return None
    return lambda n: links.comm_seconds(GRID, params, n, preset, itemsizes=(itemsize, itemsize))


SOURCES = {"measured": "measured in this run's compiled steps at N = {n}",
           "theory": "the ring theory of each strategy at N = {n} (jaxdp/analysis/theory.py): a run on one device "
                     "sends nothing, so nothing can be measured"}
NOT_PROJECTED = registry.names(one_device=True)  # one device: no data parallelism to project


def for_report(sent_by_strategy: dict, run_params: int, itemsize: int, flops_per_sample: float, n_measured: int,
               global_batch: int, run_label: str, preset: Preset = H100_NVLINK_IB, source: str = "measured") -> dict:
    """summary.json's "projection": the reference models, and the run's own model where CRITERION holds.
    `sent_by_strategy`: bytes per device per step at `n_measured` devices, `source` says whence (SOURCES)."""
    sent_by_strategy = {s: b for s, b in sent_by_strategy.items() if s not in NOT_PROJECTED}
    bpp = {s: bytes_per_param(b, run_params) for s, b in sent_by_strategy.items()}
    phases = {s: ring_phases(b, n_measured, run_params, itemsize) for s, b in sent_by_strategy.items()}
    per_device = global_batch / n_measured
    bound = compute_bound(flops_per_sample, sent_by_strategy, n_measured, per_device, phases, preset)
    models = {m.name: reference(m, bpp, phases, n_measured, preset, itemsize) for m in references.REFERENCES}
    if bound["compute_bound"]:
        models[f"this run ({run_label})"] = {
            "params": run_params, "flops_per_sample": flops_per_sample, "batch_seqs": global_batch,
            "source": "this run (FLOPs per sample: XLA cost analysis; bytes: compiled HLO)",
            "strategies": {s: project(flops_per_sample, b, n_measured, per_device, global_batch, preset, phases[s])
                           for s, b in sent_by_strategy.items()}}
    return {"preset": asdict(preset), "measured_devices": n_measured, "bytes_per_param": bpp, "ring_phases": phases,
            "source": source, "source_text": SOURCES[source].format(n=n_measured),
            "run": {"label": run_label, "params": run_params, "flops_per_sample": flops_per_sample, **bound},
            "criterion": CRITERION, "models": models, "links": _links(models, preset)}


LINK_NS = (8, 16, 128, 1024)


def _links(models: dict, preset: Preset) -> dict:
    """The links section: the projection's own rows of ddp, zero3 and hsdp at LINK_NS with the full-overlap bound
    beside them (one number per fact: the same weak efficiency as the projection and the recommendation), and
    the published scaling points (`links.published`, in the published runs' mixed precision)."""
    table = []
    for name, m in models.items():
        for s in (s for s in links.STRATEGIES if s in m.get("strategies", {}) and "flops_per_token" in m):
            for r in (r for r in m["strategies"][s]["rows"] if r["n"] in LINK_NS):
                compute = r["weak_step_s"] - r["comm_s"]
                table.append({"model": name, "strategy": s, "n": r["n"], "compute_s": compute, "comm_s": r["comm_s"],
                              "weak_efficiency": r["weak_efficiency"],
                              "overlapped_efficiency": compute / max(compute, r["comm_s"])})
    return {"table": table, "published": links.published(preset), "assumptions": links.__doc__}


NOTHING = ("Nothing to project: no data-parallel strategy in this run (`single` runs on one device and sends "
           "nothing); compare data-parallel strategies, e.g. --strategies ddp,zero3.")


def caption(proj: dict) -> str:
    """What the scaling figure projects, in words: the models, the measured bytes, the run's own model."""
    phases = proj["ring_phases"]
    if not phases:
        return NOTHING
    bpp = ", ".join(f"{s} {b:.2f} ({phases[s]:.1f} ring phases)" for s, b in proj["bytes_per_param"].items())
    run = proj["run"]
    own = (f"The run's own model ({run['label']}) is drawn too: compute-bound" if run["compute_bound"] else
           f"The run's own model ({run['label']}, {run['params']:,} parameters) is not drawn: not compute-bound")
    where = proj.get("source_text", f"measured in this run's compiled steps at N = {proj['measured_devices']}")
    return (f"Bytes sent per device per step per parameter, {where}: {bpp}; hsdp, when not in this run: the links "
            f"model (NVLink inside a node, one NIC per GPU across). FLOPs/token = 6 N + 12 L d T. Weak: one sequence "
            f"per GPU; strong: the published batch, drawn while each GPU holds a sequence (the run's own model: its "
            f"own batch). {own} ({run['compute_s']:.2g} s "
            f"compute vs {run['comm_s']:.2g} s communication per step at {NS[0]} GPUs).")


SAME = 1e-3  # relative: two projections closer than this draw one line


def lines(proj: dict, model: str, kind: str) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """(label, N, efficiency) of each line the scaling figure draws for `model`: strategies whose projections
    agree within SAME (lines that would overlap) are one line, labelled with all their names ("ddp = ddp-ring"),
    so every legend entry is a line one can see."""
    out = []
    for name, p in proj["models"][model]["strategies"].items():
        ns, eff = efficiencies(p, kind)
        label = name + (" (links model)" if p.get("projected_only") else "")
        same = next((i for i, (_, n2, e2) in enumerate(out) if np.array_equal(ns, n2)
                     and np.allclose(eff, e2, rtol=SAME, atol=0)), None)
        if same is None:
            out.append((label, ns, eff))
        else:
            out[same] = (f"{out[same][0]} = {label}", ns, eff)
    return out


def efficiencies(proj: dict, kind: str) -> tuple[np.ndarray, np.ndarray]:
    """(N, efficiency) of one strategy's projection, without the N where strong scaling is undefined."""
    rows = [r for r in proj["rows"] if r[f"{kind}_efficiency"] is not None]
    return np.array([r["n"] for r in rows]), np.array([r[f"{kind}_efficiency"] for r in rows])
