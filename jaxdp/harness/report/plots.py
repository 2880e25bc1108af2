"""The compare report's six figures, drawn with matplotlib from `summary.json`'s contents."""
from __future__ import annotations

import os
import textwrap

import matplotlib

matplotlib.use("Agg")
import matplotlib.lines  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402
import numpy as np  # noqa: E402

from . import projection as projection_mod  # noqa: E402
from .overflow import overflow  # noqa: E402, F401 (the figures' own check, used by the tests)
from .projection import NOTHING  # noqa: E402, F401 (the caption when nothing is projected)
from .projection import caption as scaling_caption  # noqa: E402, F401 (the figure's caption, in words)

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
THEORY = "theory (total)"
PARTS = ("params", "grads", "opt_state", "master_params")  # master_params: torch zero2's fp-master shard
PART_COLORS = {"params": "#4c72b0", "grads": "#dd8452", "opt_state": "#55a868", "master_params": "#8c8c8c"}


def _frameworks(entry):
    return [f for f in ("jax", "torch") if f in entry["frameworks"] and "error" not in entry["frameworks"][f]]


def _figure(width, height, *args, **kwargs):
    """A figure laid out by matplotlib's constrained layout (titles, labels and outside legends get room)."""
    return plt.subplots(*args, figsize=(width, height), layout="constrained", **kwargs)


def _title(fig, text: str, fontsize=10):
    """A suptitle wrapped to the figure's width (at most 12 characters per inch at size 10)."""
    width = max(20, int(fig.get_figwidth() * 120 / fontsize))
    fig.suptitle("\n".join(textwrap.fill(line, width) for line in text.split("\n")), fontsize=fontsize)


def _legend(fig, ax=None, handles=None, labels=None):
    """One legend for the figure, outside the axes on the right (never over the data)."""
    if handles is None:
        handles, labels = (ax or fig.axes[0]).get_legend_handles_labels()
    theory = matplotlib.lines.Line2D([], [], color="black", linewidth=2)  # the bars' "_" markers, at legend size
    handles = [theory if label == THEORY else h for h, label in zip(handles, labels, strict=True)]
    return fig.legend(handles, labels, loc="outside right center", fontsize=8)


def _integer_steps(ax):
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))


def _save(fig, path):
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def loss_curves(summary, path):
    entries = summary["strategies"]
    cols = min(4, len(entries))
    rows = -(-len(entries) // cols)
    fig, axes = _figure(max(3.4 * cols + 1.2, 6.5), 2.8 * rows + 0.6, rows, cols, squeeze=False, sharey=True)
    for ax, entry in zip(axes.flat, entries, strict=False):
        for fw in _frameworks(entry):
            losses = entry["frameworks"][fw]["losses"]
            ax.plot(range(1, len(losses) + 1), losses, label=fw, markersize=3, **FRAMEWORK_STYLE[fw])
        ax.set_title(entry["name"], fontsize=10)
        ax.set_xlabel("step")
        _integer_steps(ax)
        ax.grid(alpha=0.3)
    for ax in axes[:, 0]:
        ax.set_ylabel("loss (mean cross-entropy)")
    for ax in list(axes.flat)[len(entries) :]:
        ax.axis("off")
    _legend(fig, axes.flat[0])
    _title(fig, "1. Loss per step: JAX (solid) and PyTorch (dashed) overlaid")
    return _save(fig, path)


LINESTYLES = ("-", "--", ":", "-.")


def parity(summary, path):
    fig, axes = _figure(11, 4.0, 1, 2, sharey=True)
    tol = summary["tolerance"]
    for ax, field in zip(axes, ("grad", "param"), strict=False):
        for i, entry in enumerate(summary["strategies"]):
            errs = entry.get("parity", {}).get(field)
            if errs:
                steps = np.arange(1, len(errs) + 1)
                ax.semilogy(steps, np.maximum(errs, 1e-18), marker="ox+s^v"[i % 6], markersize=4,
                            linestyle=LINESTYLES[i % 4], label=entry["name"], color=plt.cm.tab10(i % 10))
        ax.axhline(tol, color="black", linestyle=":", label=f"tolerance {tol:g}")
        ax.set_title(f"{'gradients' if field == 'grad' else 'parameters'}: worst relative difference", fontsize=10)
        ax.set_xlabel("step")
        _integer_steps(ax)
        ax.grid(alpha=0.3, which="both")
    axes[0].set_ylabel("max |jax - torch| / max |torch|")
    _legend(fig, axes[1])
    _title(fig, "2. Cross-framework difference per step, JAX vs torch (log scale; 1e-18 floors exact zeros)")
    return _save(fig, path)


def _ms(x: float) -> str:
    return f"{x:.3g} ms"


def _two_and_five(v, _) -> str:
    """Minor ticks of a log axis labelled at 2 and 5 of each decade only (the others crowd)."""
    lead = v / 10 ** np.floor(np.log10(v)) if v > 0 else 0
    return f"{v:g}" if round(lead) in (2, 5) else ""


def step_times(summary, path):
    """Grouped bars on a log axis (a framework 10x slower than the other still leaves both readable), each
    labelled with its median."""
    entries = summary["strategies"]
    fig, ax = _figure(max(6.5, 1.5 * len(entries) + 3), 4.2)
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
        bars = ax.bar(xs, med, width, yerr=[lo, hi], capsize=3, label=fw, color=FRAMEWORK_STYLE[fw]["color"],
                      alpha=0.85)
        ax.bar_label(bars, labels=[_ms(m) for m in med], fontsize=7, padding=2)
    ax.set_yscale("log")
    ax.set_ylim(top=ax.get_ylim()[1] * 2.5)  # room for the labels
    ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(matplotlib.ticker.FuncFormatter(_two_and_five))
    ax.set_xticks(range(len(entries)), [e["name"] for e in entries])
    ax.set_ylabel("step time, ms (log): median;\nwhiskers: 25th-75th percentile")
    _legend(fig, ax)
    _title(fig, "3. Step time per strategy and framework (compilation and warm-up excluded; "
                f"{summary['machine']['platform']}, {summary['devices']} devices)")
    ax.grid(axis="y", alpha=0.3, which="both")
    return _save(fig, path)


BYTE_UNITS = (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10), ("B", 1))


def _byte_unit(largest: float) -> tuple[str, float]:
    """The unit an axis of bytes reads best in: the largest whose value at `largest` is at least 1."""
    return next(((n, s) for n, s in BYTE_UNITS if largest >= s), BYTE_UNITS[-1])


def _stacked(ax, labels, values_by_part, parts, colors, formula=None, largest=0.0) -> tuple[str, float]:
    """Stacked bars of bytes in the unit that reads best (for them and `largest`); returns (unit, bytes per unit)."""
    totals = [sum(v.get(p, 0.0) for p in parts) for v in values_by_part] + [f or 0 for f in (formula or [])]
    unit, scale = _byte_unit(max(totals + [largest], default=1))
    bottom = np.zeros(len(labels))
    for part in [p for p in parts if any(v.get(p) for v in values_by_part)]:  # those present, in order
        vals = np.array([v.get(part, 0.0) for v in values_by_part], dtype=float) / scale
        ax.bar(range(len(labels)), vals, bottom=bottom, color=colors[part], label=part)
        bottom += vals
    if formula is not None:
        tot = np.array([f if f is not None else np.nan for f in formula], dtype=float) / scale
        ax.scatter(range(len(labels)), tot, marker="_", s=900, color="black", zorder=5, label=THEORY)
        bottom = np.fmax(bottom, np.nan_to_num(tot))
    ax.set_ylim(0, 1.12 * max(float(bottom.max()), 1e-9))
    ax.set_xticks(range(len(labels)), labels, fontsize=8)
    return unit, scale


def memory(summary, path):
    """Two panels, each on its own scale (a transformer's state can be 1/20 of its in-step peak): the state
    between steps (stacked parts, the ZeRO formula's total) and the in-step peak."""
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
    fig, (ax, right) = _figure(max(9.0, 1.6 * len(labels) + 3.5), 4.4, 1, 2)
    unit, _ = _stacked(ax, labels, values, PARTS, PART_COLORS, formula)
    ax.set_ylabel(f"{unit} per device")
    ax.set_title("state between steps", fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    shown = [p or 0 for p in peaks]
    peak_unit, scale = _byte_unit(max(shown, default=1))
    bars = right.bar(range(len(labels)), np.array(shown, dtype=float) / scale, color="crimson", alpha=0.8,
                     label="in-step peak")
    right.bar_label(bars, labels=["-" if p is None else f"{p / scale:.3g}" for p in peaks], fontsize=7, padding=2)
    right.set_ylim(0, 1.15 * max(float(max(shown, default=0)) / scale, 1e-9))
    right.set_xticks(range(len(labels)), labels, fontsize=8)
    right.set_ylabel(f"{peak_unit} per device")
    right.set_title("in-step peak (JAX memory_analysis, torch profiler)", fontsize=10)
    right.grid(axis="y", alpha=0.3)
    handles, names = ax.get_legend_handles_labels()
    more, more_names = right.get_legend_handles_labels()
    _legend(fig, handles=handles + more, labels=names + more_names)
    _title(fig, "4. Per-device memory: the state between steps (parameters, gradients, optimizer state; black line: "
                "ZeRO formula) and the in-step peak, each on its own scale")
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
    fig, ax = _figure(max(6.5, 0.9 * len(labels) + 3.5), 4.4)
    unit, _ = _stacked(ax, labels, values, KINDS, KIND_COLORS, formula)
    ax.set_ylabel(f"{unit} sent per device per step")
    _legend(fig, ax)
    _title(fig, "5. Communication per device per step, by collective (measured bars; black line: ring theory)")
    ax.grid(axis="y", alpha=0.3)
    return _save(fig, path)


MODEL_STYLES = ("-", "--", ":", "-.")


def scaling(summary, path):
    proj = summary["projection"]
    if not proj["bytes_per_param"]:  # `single` alone: one sentence, no empty axes
        fig, ax = _figure(8, 1.6)
        ax.axis("off")
        ax.text(0.5, 0.5, textwrap.fill(projection_mod.NOTHING, 90), ha="center", va="center", fontsize=10)
        _title(fig, "6. Projected scaling")
        return _save(fig, path)
    models = list(proj["models"])
    names = list(dict.fromkeys(s for m in models for s in proj["models"][m]["strategies"]))
    fig, axes = _figure(12, 5.2, 1, 2, sharey=True)
    for ax, kind in zip(axes, ("weak", "strong"), strict=False):
        for m, model in enumerate(models):
            for label, ns, eff in projection_mod.lines(proj, model, kind):
                i = names.index(label.split(" ")[0])
                ax.loglog(ns, eff, base=2, marker="ox+s^v"[i % 6], markersize=4, color=plt.cm.tab10(i % 10),
                          linestyle=MODEL_STYLES[m % len(MODEL_STYLES)], label=f"{model}: {label}")
        ax.axvline(projection_mod.NODE_GPUS, color="gray", linestyle=":")
        ax.set_xlabel("GPUs (N); dotted: one 8-GPU NVLink node")
        ax.set_title(f"{kind} scaling efficiency"
                     + (" (one sequence per GPU)" if kind == "weak" else " (published global batch)"), fontsize=10)
        ax.grid(alpha=0.3, which="both")
        ax.set_yscale("log")
        ax.set_ylim(top=1.5)
    axes[0].set_ylabel("efficiency (log; 1 = perfect)")
    if names:
        _legend(fig, axes[0])  # the weak panel draws every line the strong one does (strong stops at 512)
    listed = ", ".join(models[:-1]) + " and " + models[-1] if len(models) > 1 else "".join(models) or "nothing"
    whence = "as measured in this run" if proj.get("source", "measured") == "measured" else "from the ring theory"
    _title(fig, f"6. Projected scaling of {listed} on H100s (modelled), with each strategy's "
                f"bytes/parameter {whence}")
    fig.supxlabel(textwrap.fill(projection_mod.caption(proj), 190), fontsize=7.5, x=0.0, ha="left")
    return _save(fig, path)


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
