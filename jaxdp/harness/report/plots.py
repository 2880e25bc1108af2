"""The compare report's six figures, drawn with matplotlib from `summary.json`'s contents."""
from __future__ import annotations

import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from . import projection as projection_mod  # noqa: E402

FRAMEWORK_STYLE = {"jax": dict(color="#1f77b4", linestyle="-", marker="o"),
                   "torch": dict(color="#d62728", linestyle="--", marker="x")}
KINDS = ("all-reduce", "reduce-scatter", "all-gather", "point-to-point", "broadcast", "reduce")
KIND_COLORS = {
    "all-reduce": "#4c72b0",
    "reduce-scatter": "#dd8452",
    "all-gather": "#55a868",
    "point-to-point": "#8172b3",
    "broadcast": "#c44e52",
    "reduce": "#937860",
}
PARTS = ("params", "grads", "opt_state")
PART_COLORS = {"params": "#4c72b0", "grads": "#dd8452", "opt_state": "#55a868"}


def _frameworks(entry):
    return [f for f in ("jax", "torch") if f in entry["frameworks"] and "error" not in entry["frameworks"][f]]


def _save(fig, path):
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def loss_curves(summary, path):
    entries = summary["strategies"]
    cols = min(4, len(entries))
    rows = -(-len(entries) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 2.8 * rows), squeeze=False, sharey=True)
    for ax, entry in zip(axes.flat, entries, strict=False):
        for fw in _frameworks(entry):
            losses = entry["frameworks"][fw]["losses"]
            ax.plot(range(1, len(losses) + 1), losses, label=fw, markersize=3, **FRAMEWORK_STYLE[fw])
        ax.set_title(entry["name"])
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    for ax in axes[:, 0]:
        ax.set_ylabel("loss (mean cross-entropy)")
    for ax in list(axes.flat)[len(entries) :]:
        ax.axis("off")
    axes.flat[0].legend()
    fig.suptitle("1. Loss per step: JAX (solid) and PyTorch (dashed) overlaid")
    return _save(fig, path)


def parity(summary, path):
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8), sharey=True)
    tol = summary["tolerance"]
    for ax, field in zip(axes, ("grad", "param"), strict=False):
        for i, entry in enumerate(summary["strategies"]):
            errs = entry.get("parity", {}).get(field)
            if errs:
                steps = np.arange(1, len(errs) + 1)
                ax.semilogy(
                    steps,
                    np.maximum(errs, 1e-18),
                    marker="o",
                    markersize=3,
                    label=entry["name"],
                    color=plt.cm.tab10(i % 10),
                )
        ax.axhline(tol, color="black", linestyle=":", label=f"tolerance {tol:g}")
        ax.set_title(f"{'gradients' if field == 'grad' else 'parameters'}: worst relative difference, JAX vs torch")
        ax.set_xlabel("step")
        ax.grid(alpha=0.3, which="both")
    axes[0].set_ylabel("max |jax - torch| / max |torch|")
    axes[1].legend(fontsize=8, loc="upper left")
    fig.suptitle("2. Cross-framework difference per step (log scale; 1e-18 floors exact zeros)")
    return _save(fig, path)


def step_times(summary, path):
    entries = summary["strategies"]
    fig, ax = plt.subplots(figsize=(max(7, 1.4 * len(entries) + 2), 4))
    width = 0.38
    for j, fw in enumerate(("jax", "torch")):
        xs, med, lo, hi = [], [], [], []
        for i, entry in enumerate(entries):
            if fw not in _frameworks(entry):
                continue
            r = entry["frameworks"][fw]
            xs.append(i + (j - 0.5) * width)
            med.append(1e3 * r["median_step_s"])
            lo.append(1e3 * (r["median_step_s"] - r["p25_step_s"]))
            hi.append(1e3 * (r["p75_step_s"] - r["median_step_s"]))
        ax.bar(xs, med, width, yerr=[lo, hi], capsize=3, label=fw, color=FRAMEWORK_STYLE[fw]["color"], alpha=0.85)
    ax.set_xticks(range(len(entries)), [e["name"] for e in entries])
    ax.set_ylabel("step time (ms): median, bars = 25th-75th percentile")
    ax.set_title(
        "3. Step time per strategy and framework\n(compilation and warm-up excluded; "
        f"{summary['machine']['platform']}, {summary['devices']} devices)",
        fontsize=10,
    )
    ax.legend()
    ax.grid(axis="y", alpha=0.3)
    return _save(fig, path)


def _stacked(ax, labels, values_by_part, parts, colors, formula=None):
    bottom = np.zeros(len(labels))
    for part in parts:
        vals = np.array([v.get(part, 0.0) for v in values_by_part], dtype=float) / 1024
        ax.bar(range(len(labels)), vals, bottom=bottom, color=colors[part], label=part)
        bottom += vals
    if formula is not None:
        tot = np.array([f if f is not None else np.nan for f in formula], dtype=float) / 1024
        ax.scatter(range(len(labels)), tot, marker="_", s=900, color="black", zorder=5, label="theory (total)")
        bottom = np.fmax(bottom, np.nan_to_num(tot))
    ax.set_ylim(0, 1.12 * max(float(bottom.max()), 1e-9))
    ax.set_xticks(range(len(labels)), labels, rotation=30, ha="right", fontsize=8)


def memory(summary, path):
    labels, values, formula, peaks = [], [], [], []
    for entry in summary["strategies"]:
        for fw in _frameworks(entry):
            mem = entry["frameworks"][fw].get("memory")
            if mem:
                labels.append(f"{entry['name']}\n{fw}")
                values.append(mem)
                peaks.append(entry["frameworks"][fw].get("peak_bytes"))
                theory = entry.get("theory", {}).get("memory")
                formula.append(sum(theory.values()) if theory else None)
    fig, ax = plt.subplots(figsize=(max(7, 0.9 * len(labels) + 2), 4.2))
    _stacked(ax, labels, values, PARTS, PART_COLORS, formula)
    peak = np.array([np.nan if p is None else p / 1024 for p in peaks], dtype=float)
    if np.isfinite(peak).any():
        ax.scatter(range(len(labels)), peak, marker="D", s=40, color="crimson", zorder=6, label="in-step peak")
        ax.set_ylim(0, 1.12 * max(ax.get_ylim()[1] / 1.12, float(np.nanmax(peak))))
    ax.set_ylabel("KiB per device")
    ax.set_title(
        "4. Per-device memory: state between steps (bars: parameters, gradients, optimizer state; black line =\n"
        "ZeRO formula) and the in-step peak (red: JAX memory_analysis, torch profiler memory events)",
        fontsize=10,
    )
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    return _save(fig, path)


def communication(summary, path):
    labels, values, formula = [], [], []
    for entry in summary["strategies"]:
        for fw in _frameworks(entry):
            comm = entry["frameworks"][fw].get("comm")
            if comm is not None:
                labels.append(f"{entry['name']}\n{fw}")
                values.append(comm)
                theory = entry.get("theory", {}).get("comm")
                formula.append(theory["total"] if theory else None)
    fig, ax = plt.subplots(figsize=(max(7, 0.9 * len(labels) + 2), 4.2))
    _stacked(ax, labels, values, KINDS, KIND_COLORS, formula)
    ax.set_ylabel("KiB sent per device per step")
    ax.set_title(
        "5. Communication per device per step, by collective\n(measured bars; black line = ring theory)", fontsize=10
    )
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    return _save(fig, path)


MODEL_STYLES = ("-", "--", ":", "-.")


def scaling_caption(proj: dict) -> str:
    """What the scaling figure projects, in words: the models, the measured bytes, the run's own model."""
    phases = proj["ring_phases"]
    bpp = ", ".join(f"{s} {b:.2f} ({phases[s]:.1f} ring phases)" for s, b in proj["bytes_per_param"].items())
    run = proj["run"]
    own = (f"The run's own model ({run['label']}) is drawn too: compute-bound" if run["compute_bound"] else
           f"The run's own model ({run['label']}, {run['params']:,} parameters) is not drawn: not compute-bound")
    return (f"Bytes sent per device per step per parameter, measured in this run at N = {proj['measured_devices']}: "
            f"{bpp}. FLOPs/token = 6 N + 12 L d T. Weak: one sequence per GPU; strong: the published batch, drawn "
            f"while each GPU holds a sequence (the run's own model: its own batch). {own} ({run['compute_s']:.2g} s "
            f"compute vs {run['comm_s']:.2g} s communication per step at {projection_mod.NS[0]} GPUs).")


def scaling(summary, path):
    proj = summary["projection"]
    models = list(proj["models"])
    strategies = list(proj["bytes_per_param"])
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.6), sharey=True)
    for ax, kind in zip(axes, ("weak", "strong"), strict=False):
        for m, model in enumerate(models):
            for i, name in enumerate(strategies):
                ns, eff = projection_mod.efficiencies(proj["models"][model]["strategies"][name], kind)
                ax.loglog(ns, eff, base=2, marker="ox+s^v"[i % 6], markersize=4, color=plt.cm.tab10(i % 10),
                          linestyle=MODEL_STYLES[m % len(MODEL_STYLES)], label=f"{model}: {name}")
        ax.axvline(projection_mod.NODE_GPUS, color="gray", linestyle=":")
        ax.set_xlabel("GPUs (N); dotted: one 8-GPU NVLink node")
        ax.set_title(f"{kind} scaling efficiency"
                     + (" (one sequence per GPU)" if kind == "weak" else " (published global batch)"), fontsize=10)
        ax.grid(alpha=0.3, which="both")
        ax.set_yscale("log")
        ax.set_ylim(top=1.5)
    axes[0].set_ylabel("efficiency (log; 1 = perfect)")
    axes[1].legend(fontsize=7, loc="lower left")
    names = ", ".join(models[:-1]) + " and " + models[-1]
    fig.suptitle(f"6. Projected scaling of {names} on H100s (alpha-beta model), "
                 "with each strategy's bytes/parameter as measured in this run", fontsize=10)
    fig.text(0.01, 0.01, scaling_caption(proj), fontsize=7.5, wrap=True, va="bottom")
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


FIGURES = (
    ("loss.png", loss_curves),
    ("parity.png", parity),
    ("step_time.png", step_times),
    ("memory.png", memory),
    ("communication.png", communication),
    ("scaling.png", scaling),
)


def draw_all(summary, folder) -> list[str]:
    return [fn(summary, os.path.join(folder, name)) for name, fn in FIGURES]
