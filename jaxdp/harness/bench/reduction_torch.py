"""Item 9's torch side: `reduction="canonical"` against `native` in torch_ref, for every row of item 9
whose strategy torch_ref has (`plan.torch_reduction_runs`), measured by torch_ref's own tool
(`torch_ref.analysis.canonical_cost`: one world of N ranks per N, in each rank both modes built from the
same values and called in turn, one intra-op thread in both, the slowest rank's median; temporaries:
rank 0's largest rise within one step, from the profiler's memory events). The rows carry the jaxdp
row's ratio of the same (model, strategy, N) beside torch's (`side_by_side`), so the two frameworks
read side by side in one table (`markdown.reduction_section`).
"""
from __future__ import annotations

from .plan import Plan, torch_reduction_runs

TIMEOUT_S = 1800.0  # one world's whole measurement (every model's configurations at one N)


def torch_rows(p: Plan, say) -> list[dict]:
    """torch_ref's canonical / native for item 9's torch rows: one world per N, every model's rows in it."""
    from torch_ref.analysis.canonical_cost import measure_canonical_cost

    groups: dict = {}
    for label, base, strategy, n in torch_reduction_runs(p):
        groups.setdefault(n, []).append((label, base.replace(strategy=strategy)))
    rows = []
    for n, runs in groups.items():
        say(f"bench: reduction (torch_ref) N={n}: {', '.join(f'{label} {c.strategy}' for label, c in runs)}")
        measured = measure_canonical_cost([c for _, c in runs], (n,), repeats=p.reduction_repeats,
                                          timeout_s=TIMEOUT_S)
        rows += [{**r, "model": label, "framework": "torch"} for (label, _), r in zip(runs, measured, strict=True)]
    return rows


def side_by_side(torch: list[dict], jax: list[dict]) -> list[dict]:
    """Each torch row with `jaxdp_ratio`: the jaxdp row's canonical / native for the same model, strategy
    and N (ZeRO's `--collectives xla` row where there are two), None where jaxdp has none."""
    jaxdp = {(r.get("model", "mlp"), r["strategy"], r["devices"]): r["ratio"] for r in jax
             if r["collectives"] in (None, "xla")}
    return [{**r, "jaxdp_ratio": jaxdp.get((r["model"], r["strategy"], r["devices"]))} for r in torch]
