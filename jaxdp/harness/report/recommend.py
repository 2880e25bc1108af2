"""Which strategy: the compare report's answer, derived from this run's measurements and the projection.

What it reads (summary.json): each strategy's measured per-device state (parameters, gradients, optimizer
state: JAX's arrays) and in-step peak (both frameworks), the bytes a device sends per step (JAX's compiled
HLO; torch's count beside it), the median step time of both frameworks, and the projection's reference
models and links (`projection`, `links`, `hardware`). From the state it computes each strategy's bytes per
parameter of a *full* copy (a sharded part measured at 1/S of it is multiplied back by S), so the state of
any model on any number of GPUs follows: full bytes/param x parameters, divided by the GPUs a part is
sharded over (N for zero1-3; S = one node for hsdp).

The rules (each situation's `why` shows the numbers it used):
- a strategy *fits* when its state takes at most STATE_SHARE of a device's memory (the rest is left for
  activations, which a toy model's peak cannot predict); the run itself is judged on its measured peak (or,
  with --target, its compiled peak); where no strategy run fits, the pick is NONE_FITS and the first line
  says why (the smallest need against the GPU's memory): nothing that does not fit is recommended;
- within one node (NVLink), among the strategies that fit: the one that sends the fewest bytes per step
  (ddp's all-reduce, 2(N-1)/N Psi, when it fits; zero3's gathers cost 1.5x that);
- across nodes (8 NICs of 400 Gb/s a node between them), among those that fit: the highest projected
  weak-scaling efficiency (no overlap), on the project's one network model (NCCL's rings cross on all of a
  node's NICs, so a 1-D ring over whole nodes runs near NVLink's speed, while hsdp's all-reduce across nodes
  runs on one NIC per GPU); hsdp enters from the links model when the run did not measure it (marked
  `projected_only`).
"""
from __future__ import annotations

import html

from ...core.run.config import ALIASES
from ...strategies.jit import layout as jit_layout
from ...strategies.zero import layout as zero_layout
from . import references
from .hardware import H100_NVLINK_IB, NODE_GPUS, Preset
from .units import efficiency, nbytes, si

STATE_SHARE = 0.5
ACROSS_NODES = 128  # 16 nodes of 8
NONE_FITS = "none of these fits"  # a situation's pick when no strategy run fits: nothing is recommended


def none_fits(s: str, need: float, limit: float, of: str) -> str:
    """The lead of a situation that no strategy fits: the smallest need against the GPU's memory."""
    return f"The smallest need, {s}'s {nbytes(need)} per GPU, is more than {si(limit, 'B')} ({of})"


def layout_of(strategy: str, shards: int, axis_type: str = "auto") -> dict:
    """summary.json's `layout` of a strategy: {"shards": devices a sharded part is split over, "sharded": {part:
    sharded?}}, from the strategy's own layout table (ZeRO's and hsdp's, or the -jit forms': fsdp-jit shards as
    zero3, zero1-jit as zero1, ddp-jit nothing)."""
    name = ALIASES.get(strategy, strategy)
    if name in jit_layout.LAYOUTS:
        return {"shards": shards, "sharded": jit_layout.LAYOUTS[name].sharded(axis_type)}
    return {"shards": shards, "sharded": zero_layout.of(name).sharded}


def measured(summary) -> dict:
    """{strategy: the numbers the rules read}, per device at the run's device count; the bytes sent per
    parameter are the projection's (measured on N > 1 devices, else the theory's: `projection.SOURCES`)."""
    n, params = summary["devices"], summary["projection"]["run"]["params"]
    bpp = summary["projection"]["bytes_per_param"]
    out = {}
    for e in summary["strategies"]:
        j, t = e["frameworks"]["jax"], e["frameworks"]["torch"]
        lay = e.get("layout") or layout_of(e["name"], n)
        full = sum(v * (lay["shards"] if lay["sharded"].get(k) else 1) for k, v in j["memory"].items())
        sharded = sum(v * lay["shards"] for k, v in j["memory"].items() if lay["sharded"].get(k))
        out[e["name"]] = {
            "state": sum(j["memory"].values()), "torch_state": sum((t.get("memory") or {}).values()) or None,
            "peak": max(p for p in (j.get("peak_bytes"), t.get("peak_bytes"), 0) if p is not None),
            "sent": j["comm"]["total"], "torch_sent": (t.get("comm") or {}).get("total"),
            "step_ms": {"jax": 1e3 * j["median_step_s"], "torch": 1e3 * t["median_step_s"]},
            "full_per_param": full / params, "sharded_per_param": sharded / params,
            "sent_per_param": bpp.get(e["name"], 0.0), "shards": lay["shards"],
            "param_bytes": j["memory"]["params"] * (lay["shards"] if lay["sharded"].get("params") else 1) / params,
            "hsdp": e["name"] == "hsdp", "compiled_peak": (e.get("target") or {}).get("peak_bytes")}
    return out


def state_at(m: dict, params: float, n: int) -> float:
    """Bytes of state per device for a model of `params` on n GPUs (hsdp: sharded over min(n, a node))."""
    shards = min(n, NODE_GPUS) if m["hsdp"] else n
    return params * (m["full_per_param"] - m["sharded_per_param"] + m["sharded_per_param"] / shards)


def _phases(summary, s: str) -> str:
    """', k ring phases: k(N-1)/N Psi' from the projection's count of s's measured bytes."""
    k = summary["projection"].get("ring_phases", {}).get(s)
    return "" if not k else f", {k:.2g} ring phases: {k:.2g}(N-1)/N Psi"


def _share(x: float) -> str:
    return f"{x:.0%}" if x >= 0.01 else f"{x:.1e}"


def _sent(m: dict) -> str:
    return f"{nbytes(m['sent'])} JAX / {nbytes(m['torch_sent'])} torch"


def _fmt_ms(m: dict) -> str:
    return f"{m['step_ms']['jax']:.3g} ms JAX / {m['step_ms']['torch']:.3g} ms torch"


def this_run(summary, meas: dict, budget: float) -> dict:
    """The run's own model on its own devices, judged on the measured peak (compare --target: the peak of the
    step compiled for the target GPU, `compiled_peak`)."""
    n, run = summary["devices"], summary["projection"]["run"]
    target = summary.get("target")
    if target:
        meas = {s: {**m, "peak": m["compiled_peak"]} for s, m in meas.items()}
    fits = {s: m["peak"] <= budget for s, m in meas.items()}
    kind = f"compiled peak on the {target['name'].upper()} (XLA:GPU)" if target else "in-step peak"
    if not any(fits.values()):  # nothing to recommend: the smallest need, and every strategy's beside it
        least = min(meas, key=lambda s: meas[s]["peak"])
        why = [none_fits(least, meas[least]["peak"], budget, f"one GPU's memory; {kind}") + "."]
        why += [f"{s}: {kind} {nbytes(m['peak'])} per device ({_share(m['peak'] / budget)} of {si(budget, 'B')}); "
                f"does not fit" for s, m in meas.items()]
        return _this_run_row(summary, NONE_FITS, fits, why)
    pool = [s for s in meas if fits[s]]
    pick = min(pool, key=lambda s: (meas[s]["sent"], meas[s]["state"]))
    p = meas[pick]
    why = [f"{pick}: {kind} {nbytes(p['peak'])} per device ({_share(p['peak'] / budget)} of {si(budget, 'B')})"
           ", so the state fits one device" + f"; sends {_sent(p)} per step ({p['sent'] / run['params']:.3g} B/param"
           + (_phases(summary, pick) if n > 1 else "") + f"), the least of those that fit; step {_fmt_ms(p)}."]
    for s, m in meas.items():
        if s != pick:
            why.append(f"{s}: state {nbytes(m['state'])} (x{m['state'] / p['state']:.2g}), sends "
                       f"{_sent(m)} (JAX x{m['sent'] / max(p['sent'], 1):.2g}), step {_fmt_ms(m)}"
                       + ("" if fits[s] else "; does not fit"))
    fastest = {fw: min(meas, key=lambda s: meas[s]["step_ms"][fw]) for fw in ("jax", "torch")}
    if any(f != pick for f in fastest.values()):
        why.append(f"Fastest here: {fastest['jax']} (JAX), {fastest['torch']} (torch); on simulated devices the "
                   "'devices' share CPU cores, so these times say little about GPUs.")
    return _this_run_row(summary, pick, fits, why)


def _this_run_row(summary, pick: str, fits: dict, why: list[str]) -> dict:
    n, run, target = summary["devices"], summary["projection"]["run"], summary.get("target")
    where = f"{n} {target['name'].upper()}s (compiled)" if target else f"{n} device{'s' * (n > 1)} (measured)"
    return {"situation": f"this run: {run['label']}, {run['params']:,} parameters, {where}",
            "model": run["label"], "params": run["params"], "devices": n, "pick": pick, "projected_only": False,
            "fits": fits, "why": why}


def one_node(summary, model, meas: dict, budget: float, n: int = NODE_GPUS) -> dict:
    """A reference model on one node: the least traffic among the strategies whose state fits."""
    p = references.params(model)
    hsdp = meas.get("hsdp")  # on one node hsdp is one group of S = n: zero3 (its bytes here had R groups)
    meas = {s: m for s, m in meas.items() if s != "hsdp" or n > NODE_GPUS}
    state = {s: state_at(m, p, n) for s, m in meas.items()}
    fits = {s: state[s] <= STATE_SHARE * budget for s in meas}
    pool = [s for s in meas if fits[s]]
    pick = min(pool, key=lambda s: (meas[s]["sent_per_param"], state[s])) if pool else NONE_FITS
    least = min(meas, key=lambda s: meas[s]["sent_per_param"])
    why = [f"{s}: state {nbytes(state[s])} per GPU ({meas[s]['full_per_param']:.3g} B/param"
           + (f", sharded parts / {min(n, NODE_GPUS) if meas[s]['hsdp'] else n}" if meas[s]["sharded_per_param"]
              else ", a full copy") + f"), {'fits' if fits[s] else 'does not fit'}; sends "
           f"{meas[s]['sent_per_param']:.3g} B/param per step" + _phases(summary, s)
           + ("" if s == least or not meas[least]["sent_per_param"]
              else f", x{meas[s]['sent_per_param'] / meas[least]['sent_per_param']:.2g} {least}'s")
           for s in meas]
    if not pool:
        smallest = min(meas, key=state.get)
        lead = none_fits(smallest, state[smallest], STATE_SHARE * budget, _state_limit(budget))
    else:
        lead = f"{pick} fits in {si(STATE_SHARE * budget, 'B')} and sends the least of those that fit"
    if pool and least != pick:
        lead += (f"; {least}, which sends less, needs {nbytes(state[least])} per GPU" if not fits[least] else
                 f"; {least} sends as little and holds more")
    if hsdp and "hsdp" not in meas:
        why.append(f"hsdp: on one node it is one shard group of {n}, i.e. zero3 (its bytes measured here include "
                   "the all-reduce across groups, which one node does not have)")
    return {"situation": f"{model.name} ({p / 1e9:.3g}B parameters) on one node of {n} GPUs (NVLink)",
            "model": model.name, "params": p, "devices": n, "pick": pick, "projected_only": False, "fits": fits,
            "why": [lead + "."] + why + [basis(summary)]}


def _efficiency(summary, model, s: str, n: int) -> float:
    """Projected weak efficiency (no overlap) of s at n: the projection's row, the one source of the figure
    (measured bytes, or for an unmeasured hsdp the links model, in the run's parameter dtype)."""
    rows = summary["projection"]["models"][model.name]["strategies"][s]["rows"]
    return next(r for r in rows if r["n"] == n)["weak_efficiency"]


def across_nodes(summary, model, meas: dict, budget: float, n: int = ACROSS_NODES,
                 preset: Preset = H100_NVLINK_IB) -> dict:
    """A reference model on n GPUs over n / 8 nodes: the best projected efficiency among those that fit."""
    p = references.params(model)
    cands = dict(meas)
    if "hsdp" not in cands:  # hsdp shards parameters, gradients and optimizer state within a node
        full = max(meas.values(), key=lambda m: m["full_per_param"])
        cands["hsdp"] = {**full, "sharded_per_param": full["full_per_param"], "hsdp": True, "projected": True}
    state = {s: state_at(m, p, n) for s, m in cands.items()}
    fits = {s: state[s] <= STATE_SHARE * budget for s in cands}
    eff = {s: _efficiency(summary, model, s, n) for s in cands}
    pool = [s for s in cands if fits[s]]
    pick = max(pool, key=eff.get) if pool else NONE_FITS
    why = [f"{s}{' (projected by the links model, not in this run)' if cands[s].get('projected') else ''}: "
           f"state {nbytes(state[s])} per GPU, {'fits' if fits[s] else 'does not fit'}; weak efficiency "
           f"{efficiency(eff[s])} (no overlap)" for s in cands]
    if not pool:
        smallest = min(cands, key=state.get)
        lead = none_fits(smallest, state[smallest], STATE_SHARE * budget, _state_limit(budget))
    else:
        lead = f"{pick}: weak efficiency {efficiency(eff[pick])} at {n} GPUs, the best of those that fit"
    if pick == "hsdp":
        lead += (f"; hsdp keeps its gathers and reduce-scatter on NVLink ({si(preset.nvlink_bytes_s, 'B/s')}) "
                 f"inside a node and sends only Psi / {NODE_GPUS} across nodes")
    elif pool and "hsdp" in cands:
        lead += (f"; hsdp projects less: NCCL's 1-D rings cross nodes on all {preset.nics} NICs of a node "
                 f"({si(preset.nics * preset.ib_bytes_s, 'B/s')}, near NVLink's {si(preset.nvlink_bytes_s, 'B/s')}),"
                 f" while hsdp's all-reduce across nodes runs on one NIC per GPU ({si(preset.ib_bytes_s, 'B/s')}) "
                 "after its in-node phases" if fits["hsdp"] else "; hsdp does not fit: it shards over one node only")
    close = [s for s in pool if s != pick and efficiency(eff[s]) == efficiency(eff[pick])]
    if close:
        lead += (f" ({', '.join(close)} {'is' if len(close) == 1 else 'are'} {efficiency(eff[pick])} too, to the one "
                 "figure a modelled efficiency has: a close call)")
    return {"situation": f"{model.name} on {n} GPUs ({n // NODE_GPUS} nodes, 8 x 400 Gb/s NICs each)",
            "model": model.name, "params": p, "devices": n, "pick": pick,
            "projected_only": bool(pool and cands[pick].get("projected")), "fits": fits, "efficiency": eff,
            "why": [lead + "."] + why + [basis(summary)]}


def _state_limit(budget: float) -> str:
    return f"{STATE_SHARE:.0%} of the {si(budget, 'B')} GPU, the rest left for activations"


def basis(summary) -> str:
    """The last line of each cluster situation: where its bytes per parameter come from."""
    return "Bytes per parameter: " + summary["projection"].get("source_text", projection_source(summary)) + "."


NO_CLUSTER = ("no cluster advice: `single` runs on one device, so this run measured nothing a cluster would send; "
              "compare data-parallel strategies for that (e.g. --strategies ddp,zero3)")


def recommend(summary, preset: Preset = H100_NVLINK_IB, budget: float | None = None) -> dict:
    """summary.json's `recommendation`: the measured inputs, the assumptions, one pick per situation (the
    clusters' from the data-parallel strategies only: `single` has nothing to project, NO_CLUSTER)."""
    budget = preset.memory_bytes if budget is None else budget
    meas = measured(summary)
    cluster = {s: m for s, m in meas.items() if s in summary["projection"]["bytes_per_param"]}
    situations = [this_run(summary, meas, budget)]
    for model in references.REFERENCES if cluster else ():
        situations.append(one_node(summary, model, cluster, budget))
        situations.append(across_nodes(summary, model, cluster, budget, preset=preset))
    return {"device_memory_bytes": budget, "state_share": STATE_SHARE, "measured": meas,
            "assumptions": [f"device: {si(budget, 'B')} ({preset.name.split(',')[0]}); a model's state (parameters, "
                            f"gradients, optimizer state, in this run's dtype and optimizer) may take at most "
                            f"{STATE_SHARE:.0%} of it, the rest is left for activations"]
            + (["state measured in this run; bytes per parameter on a cluster: "
                + summary["projection"].get("source_text", projection_source(summary)) + "; efficiency: the "
                "projection's weak scaling, one sequence per GPU, no overlap"] if cluster else [NO_CLUSTER])
            + ([f"compiled: this run's in-step peaks, each strategy's step compiled by XLA:GPU for "
                f"{summary['devices']} {summary['target']['name'].upper()}s on {summary['target']['nodes']} node(s); "
                "projected: the reference models' states and efficiencies"] if summary.get("target") else []),
            "situations": situations}


def projection_source(summary) -> str:
    """Where a summary written before `projection.source` took its bytes: measured at its device count."""
    return f"measured in this run's compiled steps at N = {summary['devices']}"


WHICH_HEADER = ["situation", "use", "why (the numbers it used)"]


def as_html(rec: dict) -> str:
    """The report page's "Which strategy" table (the first line of each `why` in bold)."""
    e = html.escape
    rows = "".join(f"<tr><td>{e(r['situation'])}</td><td class='pick'>{e(r['pick'])}"
                   f"{' (projected)' if r['projected_only'] else ''}</td><td><b>{e(r['why'][0])}</b><ul>"
                   + "".join(f"<li>{e(w)}</li>" for w in r["why"][1:]) + "</ul></td></tr>" for r in rec["situations"])
    head = "".join(f"<th>{h}</th>" for h in WHICH_HEADER)
    notes = "".join(f"<li>{e(a)}</li>" for a in rec["assumptions"])
    return f"<table id='recommendation'><tr>{head}</tr>{rows}</table><ul class='small'>{notes}</ul>"


def as_lines(rec: dict) -> list[str]:
    """`jaxdp compare`'s "which strategy:" lines: each situation's pick (NONE_FITS with its reason, the smallest
    need against the GPU's memory; a pick not in this run marked projected), and with one situation, why."""
    lines = []
    for r in rec["situations"]:
        pick, why = r["pick"], r["why"][0]
        if pick == NONE_FITS:
            pick = f"{pick}: {why[0].lower()}{why[1:]}"
        projected = " (projected: not in this run)" if r["projected_only"] else ""
        lines.append(f"which strategy: {r['situation']}: {pick}{projected}")
    return lines + [f"which strategy: {rec['assumptions'][-1]}"] * (len(rec["situations"]) == 1)


def as_markdown(rec: dict) -> list[str]:
    """report.md's "Which strategy" lines."""
    lines = []
    for r in rec["situations"]:
        lines.append(f"- **{r['situation']}: {r['pick']}{' (projected)' if r['projected_only'] else ''}.** "
                     f"{r['why'][0]}")
        lines += [f"  - {w}" for w in r["why"][1:]]
    return lines + [""] + [f"Assumptions: {'; '.join(rec['assumptions'])}."]
