"""compare's kernel paths (`--kernels mirrored,fused`, docs/KERNELS.md): summary.json's `paths`, one row per
strategy and path, and the report's "Kernel paths" table. The report's other sections (verdict, bytes,
memory, projection) are the first path's; each further path trains every strategy again in both frameworks
(`runner.run_path`), judged jaxdp against torch_ref on that path by the same judge, and timed."""
from __future__ import annotations

from ..kernel_paths import label

HEADER = ["strategy", "kernels (JAX / torch)", "parity", "worst grad / param rel. diff",
          "step ms (JAX / torch, median)", "JAX / torch", "first step s (JAX / torch)"]


def row(name: str, cfg, jax_timing: dict, torch_timing: dict, judged: dict) -> dict:
    """One strategy on one path: both frameworks' step times (`core.timing`'s keys) and the judge's verdict."""
    return {"name": name, "kernels": cfg.kernels, "torch_compiled": bool(cfg.compile),
            "jax": {k: jax_timing[k] for k in ("median_step_s", "first_step_s")},
            "torch": {k: torch_timing[k] for k in ("median_step_s", "first_step_s")},
            "pass": judged["pass"], "worst": judged["worst"]}


def first(entries: list, cfg) -> list:
    """The first path's rows, from the report's entries (nothing run again)."""
    return [row(e["name"], cfg, e["frameworks"]["jax"], e["frameworks"]["torch"], e["parity"]) for e in entries]


def table_rows(summary) -> list[list[str]]:
    out = []
    for r in summary.get("paths", []):
        j, t = r["jax"]["median_step_s"], r["torch"]["median_step_s"]
        out.append([r["name"], f"{label(r['kernels'], 'jax')} / {label(r['kernels'], 'torch', r['torch_compiled'])}",
                    "pass" if r["pass"] else "FAIL", f"{r['worst']['grad']:.1e} / {r['worst']['param']:.1e}",
                    f"{1e3 * j:.2f} / {1e3 * t:.2f}", f"{j / t:.2f}" if t else "-",
                    f"{r['jax']['first_step_s']:.2f} / {r['torch']['first_step_s']:.2f}"])
    return out


NOTE = ("Each row: one strategy on one kernel path, jaxdp's run judged against torch_ref's on the same path. mirrored: "
        "the twins' op-for-op code (the reference); fused: each framework as its users run it (fused attention, bf16 "
        "weights cast once, fused optimizers); torch's eager or compiled (--compile). The sections above are the "
        "first path's.")


def html(summary, table_html) -> str:
    """The section in the HTML page (`table_html`: render's), or nothing for a summary without paths."""
    if not summary.get("paths"):
        return ""
    return f"\n<h2>Kernel paths</h2>\n{table_html('paths', HEADER, table_rows(summary))}\n<p class='small'>{NOTE}</p>"


def markdown(summary, table_md) -> list[str]:
    """The section in report.md (`table_md`: render's)."""
    if not summary.get("paths"):
        return []
    return ["", "## Kernel paths", "", *table_md(HEADER, table_rows(summary)), "", NOTE]
