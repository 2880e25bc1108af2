"""bench.md: the results as markdown tables, one section per item."""
from __future__ import annotations

from . import fused_cost, gpu_target, jit, nan_check


def _f(x, spec=".2f", none="-"):
    return none if x is None else format(x, spec)


def _x(x):
    return "-" if x is None else f"{x:.2f}x"


def _ms(x):
    return _f(None if x is None else 1e3 * x, ".1f")


def _mark(met):
    return {True: "met", False: "NOT met", None: "-"}[met]


def _by(rows, key, value=lambda r: r) -> dict:
    """{row's key (all but the last field): {last field: value(row)}}, in the rows' order."""
    out = {}
    for r in rows:
        *outer, inner = key(r)
        out.setdefault(tuple(outer) if len(outer) > 1 else outer[0], {})[inner] = value(r)
    return out


def markdown(results: dict) -> str:
    ns = sorted({r["devices"] for r in results["communication"]["rows"]})
    lines = (_header(results) + _step_time(results) + _overhead(results) + _ring(results)
             + _communication(results, ns) + _memory(results, ns) + _compile(results, ns) + _gpu(results)
             + _collectives(results) + reduction_section(results) + jit.section(results)
             + nan_check.section(results) + gpu_target.section(results) + fused_cost.section(results))
    return "\n".join(lines) + "\n"


def _header(results: dict) -> list:
    m, s = results["machine"], results["setup"]
    v = m["versions"]
    lines = [f"# jaxdp bench{' (--quick)' if results.get('quick') else ''}", "",
             f"Machine: {m['cpu']}, {m['cores']} cores, {m['system']}; Python {m['python']}, JAX {v.get('jax')}, "
             f"jaxlib {v.get('jaxlib')}, flax {v.get('flax')}, optax {v.get('optax')}, torch {v.get('torch')}, "
             f"numpy {v.get('numpy')}. Run {results['created']}, {results['wall_s']:.0f} s"
             + "".join(f"; {k} {t:.0f} s" for k, t in results.get("item_s", {}).items()) + ".", "",
             f"Items 1-6 on {s['platform']}. Each timed run: {s['steps_per_run']} steps, {s['excluded']} excluded, "
             f"{s['statistic']} of {s['timed_steps']}"
             + "".join(f" ({k}: {n} steps, {s['statistic']} of {n - s['steps_per_run'] + s['timed_steps']})"
                       for k, n in s.get("steps_of", {}).items()) + ". Models: "
             + "; ".join(f"`{k}` " + _model_text(c) for k, c in s["models"].items()) + ".", "",
             "## Goals", "", "| item | goal | status | detail |", "|---|---|---|---|"]
    for g in results["goals"]:
        lines.append(f"| {g['item']} | {g['goal']} | {_mark(g['met']) if g['item'] not in (6,) else 'reported'}"
                     f"{' (not measured)' if g['item'] == 7 and g['met'] is None else ''} | {g['detail']} |")
    return lines


def _step_time(results: dict) -> list:
    lines = ["", "## 1. Step time, JAX vs torch (median ms; same model, batch, dtype, initial parameters)", "",
             "| model | strategy | N | kernels (JAX / torch) | JAX ms | torch ms | JAX/torch |",
             "|---|---|---:|---|---:|---:|---:|"]
    for r in results["step_time"]["rows"]:
        twin = f" (its twin {r['torch_timed_as']}'s run)" if "torch_timed_as" in r else ""
        lines.append(f"| {r['model']} | {r['strategy']} | {r['devices']} | {r.get('jax_path', 'mirrored')} / "
                     f"{r.get('torch_path', 'mirrored, eager')} | {_ms(r['jax_s'])} | "
                     f"{_ms(r['torch_s'])}{twin} | {_f(r['jax_over_torch'])} |")
    return lines


def _overhead(results: dict) -> list:
    lines = ["", "## 2. Data-parallel overhead: strategy at N over `single` (same global batch, same cores)", "",
             "| model | strategy | N | kernels | JAX | torch | goal |", "|---|---|---:|---|---:|---:|---:|"]
    by = _by(results["dp_overhead"]["rows"], lambda r: (r["model"], r["strategy"], r["devices"],
                                                         r.get("kernels", "mirrored"), r["framework"]))
    for (model, strat, n, path), fw in by.items():
        goal = fw.get("jax", fw.get("torch"))["goal"]
        lines.append(f"| {model} | {strat} | {n} | {path} | {_f(fw.get('jax', {}).get('over_single'))}x | "
                     f"{_f(fw.get('torch', {}).get('over_single'))}x | {'<= ' + _f(goal) if goal else '-'} |")
    return lines


def _ring(results: dict) -> list:
    lines = ["", "## 3. Explicit ring vs XLA's all-reduce (`ddp-ring` / `ddp`, goal <= 1.25)", "",
             "| model | N | kernels | JAX ring/ddp | torch ring/ddp |", "|---|---:|---|---:|---:|"]
    by = _by(results["ring_vs_xla"]["rows"], lambda r: (r["model"], r["devices"], r.get("kernels", "mirrored"),
                                                         r["framework"]), lambda r: r["ring_over_ddp"])
    for (model, n, path), fw in by.items():
        lines.append(f"| {model} | {n} | {path} | {_f(fw.get('jax'))}x | {_f(fw.get('torch'))}x |")
    return lines


def _main(rows: list, results: dict) -> list:
    """The rows of the comm model (the mlp); the models users port have their own table."""
    model = results["setup"]["comm_model"]["model"]
    return [r for r in rows if r.get("model", model).split(" ")[0] == model]


def _communication(results: dict, ns: list) -> list:
    cm = _main(results["communication"]["rows"], results)
    lines = ["", "## 4. Communication per device per step: compiled HLO vs theory (KiB sent; measured/theory)", "",
             f"Model: {_model_text(results['setup']['comm_model'])}. Bytes do not depend on the machine.", "",
             "| strategy | " + " | ".join(f"N={n} measured | theory | ratio" for n in ns) + " |",
             "|---|" + "---:|---:|---:|" * len(ns)]
    for strat, per_n in _by(cm, lambda r: (r["strategy"], r["devices"])).items():
        cells = []
        for n in ns:
            r = per_n.get(n)
            cells.append("- | - | -" if r is None else f"{r['measured_bytes'] / 1024:.1f} | "
                         f"{r['theory_bytes'] / 1024:.1f} | {_f(r['measured_over_theory'], '.3f')}")
        lines.append(f"| {strat} | " + " | ".join(cells) + " |")
    notes = {r["strategy"]: r["note"] for r in cm if r["note"]}
    for strat, note in notes.items():
        lines.append(f"\n- `{strat}` differs from theory: {note}.")
    return lines + _ported(results)


def _ported(results: dict) -> list:
    """Item 4 for cnn (sync BatchNorm; its running statistics' program apart) and gpt2 (tied wte)."""
    rows = [r for r in results["communication"]["rows"] if r not in _main(results["communication"]["rows"], results)]
    if not rows:
        return []
    models = results["setup"].get("ported_models", {})
    lines = ["", "Models users port: " + "; ".join(f"`{k}` {_model_text(c)}" for k, c in models.items()) + ".", "",
             "| model | strategy | N | measured KiB | theory KiB | ratio | statistics' program KiB (theory) |",
             "|---|---|---:|---:|---:|---:|---|"]
    for r in rows:
        stats = "-" if "stats_measured_bytes" not in r else \
            f"{r['stats_measured_bytes'] / 1024:.2f} ({r['stats_theory_bytes'] / 1024:.2f})"
        lines.append(f"| {r['model']} | {r['strategy']} | {r['devices']} | {r['measured_bytes'] / 1024:.1f} | "
                     f"{r['theory_bytes'] / 1024:.1f} | {_f(r['measured_over_theory'], '.3f')} | {stats} |")
    return lines


def _memory(results: dict, ns: list) -> list:
    lines = ["", "## 5. Per-device state memory vs N (KiB on device 0: params / grads / optimizer state; = formula?)",
             "", "| strategy | " + " | ".join(f"N={n}" for n in ns) + " |", "|---|" + "---|" * len(ns)]
    for strat, per_n in _by(_main(results["memory"]["rows"], results), lambda r: (r["strategy"], r["devices"])).items():
        cells = []
        for n in ns:
            r = per_n.get(n)
            cells.append("-" if r is None else f"{r['params'] / 1024:.0f} / {r['grads'] / 1024:.0f} / "
                         f"{r['opt_state'] / 1024:.0f} {'=' if r['equal_to_formula'] else '!= formula'}")
        lines.append(f"| {strat} | " + " | ".join(cells) + " |")
    return lines


def _compile(results: dict, ns: list) -> list:
    rows = results["compile"]["rows"]
    lines = ["", "## 6. Compilation time", "",
             "JAX step, lowering + XLA compile (s), by N (compiled in a child process beside item 12's "
             "compiles: these read high; the first steps below ran alone):", "",
             "| strategy | " + " | ".join(f"N={n}" for n in ns) + " |", "|---|" + "---:|" * len(ns)]
    compiled = _main([r for r in rows if r["source"] == "compile"], results)
    for strat, per_n in _by(compiled, lambda r: (r["strategy"], r["devices"]),
                            lambda r: r["lower_s"] + r["compile_s"]).items():
        lines.append(f"| {strat} | " + " | ".join(_f(per_n.get(n)) for n in ns) + " |")
    lines += ["", "First step (s; JAX: trace + compile + run; torch: as its path says, eager or torch.compile):", "",
              "| model | strategy | N | kernels (torch) | JAX | torch |", "|---|---|---:|---|---:|---:|"]
    for r in rows:
        if r["source"] == "first_step":
            lines.append(f"| {r['model']} | {r['strategy']} | {r['devices']} | "
                         f"{r.get('torch_path', 'mirrored, eager')} | {_f(r['jax_first_step_s'])} | "
                         f"{_f(r['torch_first_step_s'])} |")
    return lines


def _gpu(results: dict) -> list:
    g = results["gpu_throughput"]
    lines = ["", "## 7. GPU training throughput (bf16 `gpt`, one device)", ""]
    if not g.get("measured"):
        return lines + [f"{g['reason']} (JAX sees a GPU: {g['gpu_seen']['jax']}, torch: {g['gpu_seen']['torch']}). "
                        f"Configured: {_model_text(g['config'])}. {g['flops_formula']}; peak: {g['peak_source']}."]
    lines += [f"Device {g['device']}; {_model_text(g['config'])}; Psi = {g['psi']:,}. {g['flops_formula']}. "
              f"Peak: {g['peak_source']}.", "",
              "| framework | tokens/s | TFLOP/s | MFU | median step ms | note |", "|---|---:|---:|---:|---:|---|"]
    for fw, r in g["frameworks"].items():
        if "error" in r:
            lines.append(f"| {fw} | - | - | - | - | {r['error']} |")
        else:
            mfu = "-" if r["mfu"] is None else format(r["mfu"], ".1%")
            lines.append(f"| {fw} | {r['tokens_per_s']:,.0f} | {r['tflops']:.1f} | {mfu} | "
                         f"{_ms(r['median_step_s'])} | {r['note']} |")
    return lines


def _model_text(c: dict) -> str:
    if c.get("model") == "cnn":
        return (f"cnn channels {','.join(map(str, c['channels']))}, batchnorm {c['batchnorm']}, "
                f"batch {c['batch_size']}, {c['dtype']}, {c['optimizer']}")
    if c.get("model") == "mlp":
        return f"mlp hidden {','.join(map(str, c['hidden']))}, batch {c['batch_size']}, {c['dtype']}, {c['optimizer']}"
    parts = [f"{k} {c[k]}" for k in ("n_layer", "n_head", "d_model", "seq_len", "batch_size") if k in c]
    optimizer = f", {c['optimizer']}" if "optimizer" in c else ""
    return f"{c.get('model', 'gpt')} " + ", ".join(parts) + f", {c.get('dtype')}" + optimizer


def _collectives(results: dict) -> list:
    lines = ["", "## 8. The hand-written ring collectives alone vs XLA's built-ins (median ms; ring/XLA, "
             "goal <= 1.5 for the all-reduce)", "",
             "| op | MB per device | N | ring ms | XLA ms | ring/XLA | CPU-time ratio |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for r in results["collectives"]["rows"]:
        lines.append(f"| {r['op']} | {r['mb']:g} | {r['devices']} | {r['ring_ms']:.2f} | {r['xla_ms']:.2f} | "
                     f"{r['ratio']:.2f} | {r['cpu_ratio']:.2f} |")
    return lines


def _kib(x) -> str:
    return _f(None if x is None else x / 1024, ".1f")


def reduction_section(results: dict) -> list:
    """Item 9: `--reduction canonical` against `native` (absent from results written before it)."""
    red = results.get("reduction")
    if red is None:
        return []
    s, m = red["setup"], red["setup"]["model"]
    fma = s["fma_reference"]
    lines = ["", "## 9. `--reduction canonical` against `native` (median ms; bytes sent per device per step and "
             "temporaries from the compiled programs, KiB)", "",
             f"Models: mlp hidden {','.join(map(str, m['hidden']))}, batch {m['batch_size']}, accum {m['accum']}, "
             f"{m['dtype']}, {m['optimizer']}{_bn_model(s.get('bn_model'))}{_more(s.get('more_models'))}; S = the "
             f"default shard count unless the label says. "
             f"{s['note']}; interleaved calls, {s['warmup_calls']} warm-up then the median of {s['repeats']}."
             + (" `native+FMA`: native timed again in a process with FMA on (not interleaved); "
                "`no-FMA cost` = native / native+FMA." if fma else "") + _bn_note(s), "",
             "| model | strategy | N | S | native ms | canonical ms | canonical/native | native KiB | canonical KiB | "
             "extra KiB | native temp KiB | canonical temp KiB | extra temp KiB |"
             + (" native+FMA ms | no-FMA cost |" if fma else ""),
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|" + ("---:|---:|" if fma else "")]
    for r in red["rows"]:
        name = r["strategy"] + ("" if r["collectives"] is None else f" ({r['collectives']})")
        line = (f"| {r.get('model', 'mlp')} | {name} | {r['devices']} | {r['shards']} | {_ms(r['native_step_s'])} | "
                f"{_ms(r['canonical_step_s'])} | {_f(r['ratio'])}x | {_kib(r['native_bytes'])} | "
                f"{_kib(r['canonical_bytes'])} | {_kib(r['extra_bytes'])} | {_kib(r['native_temp_bytes'])} | "
                f"{_kib(r['canonical_temp_bytes'])} | {_kib(r['extra_temp_bytes'])} |")
        if fma:
            line += f" {_ms(r.get('native_fma_step_s'))} | {_f(r.get('no_fma_cost'))}x |"
        lines.append(line)
    return lines + _stats_bytes(red["rows"]) + _torch_rows(red.get("torch_rows"))


def _torch_rows(rows: list | None) -> list:
    """Item 9's torch_ref rows, each beside the jaxdp row's ratio for the same model, strategy and N."""
    if not rows:
        return []
    lines = ["", "torch_ref, the same rows (`torch_ref.analysis.canonical_cost`: one world per N, both modes "
             "interleaved in each rank, one intra-op thread, the slowest rank's median; temporaries: rank 0's "
             "largest rise within a step, MiB), beside jaxdp's ratio:", "",
             "| model | strategy | N | S | native ms | canonical ms | torch canonical/native | "
             "jaxdp canonical/native | native temp MiB | canonical temp MiB |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['strategy']} | {r['devices']} | {r['shards']} | {_ms(r['native_step_s'])} | "
                     f"{_ms(r['canonical_step_s'])} | {_f(r['ratio'])}x | {_x(r.get('jaxdp_ratio'))} | "
                     f"{r['native_temp_bytes'] / 2**20:.1f} | {r['canonical_temp_bytes'] / 2**20:.1f} |")
    return lines


def _bn_model(bn: dict | None) -> str:
    if bn is None:
        return ""
    return (f"; cnn channels {','.join(map(str, bn['channels']))}, {bn['batchnorm']} BatchNorm, batch "
            f"{bn['batch_size']}, accum {bn['accum']}, {bn['dtype']}, {bn['optimizer']}")


def _more(more: dict | None) -> str:
    return "".join(f"; {label}: {c['model']} batch {c['batch_size']}" + (f" x {c['seq_len']} tokens"
                   if c["model"] in ("gpt", "gpt2", "llama") else "") for label, c in (more or {}).items())


def _bn_note(s: dict) -> str:
    return f" {s['bn_note']}." if s.get("bn_note") else ""


def _stats_bytes(rows: list) -> list:
    """The cnn rows' statistics program apart (its bytes are in the table's KiB too)."""
    bn = [r for r in rows if "native_stats_bytes" in r]
    if not bn:
        return []
    lines = ["", "cnn: the running statistics' program alone (bytes sent per device per step):", "",
             "| strategy | N | native stats bytes | canonical stats bytes |", "|---|---:|---:|---:|"]
    for r in bn:
        name = r["strategy"] + ("" if r["collectives"] is None else f" ({r['collectives']})")
        lines.append(f"| {name} | {r['devices']} | {r['native_stats_bytes']:.0f} | {r['canonical_stats_bytes']:.0f} |")
    return lines
