"""The catalogue's torch plants on transformers' own models (`hf_honest`'s tiny GPT-2 with its tied head, Llama
with grouped-query attention and RMSNorm, ResNet with synchronised BatchNorm; the catalogue entries' `hf` families
Qwen2 and Mistral as transformers' own classes from `jax_hf_models.hf_config`), trained through
`torch_ref.parallelize` + `train_step` and recorded with `torch_ref.trace.Recorder` as a user porting a model
would, AdamW with torch's defaults: each bug's run against the honest run of the same strategy, N and model,
judged by `divergence.compare` (its default bounds), which must find a divergence within the run's steps and
LOCATE it: its first (step, field, tensor).

`RUNS[name]`: the strategy each class runs under and the options it needs (accumulation for the accumulation
bugs, a clip for the clipping bugs, small buckets for the bucket bugs); `FAMILIES[name]` the models it is
planted on besides the entry's `hf` (the tied-weight bug: the tied GPT-2; the BatchNorm bugs: ResNet only).
`world(rank, n, jobs)` runs jobs [(case, bug or None)] in one spawned world (`torch_ref.launch.launch`);
`located(bad, honest)` judges; `python -m tests.mutations.hf_bugs --out docs/MUTATIONS_HF.md` writes the page.
"""
from __future__ import annotations

from . import hf_honest

BUCKET_MB = 0.004  # several buckets of the tiny models (ddp-bucket, ddp)
CLIP = 0.1  # below every tiny model's local gradient norm: the clip acts
DEFAULT = ("gpt2", "llama")
FAMILIES = {"tied-grad-once": ("gpt2",), "bn-local-stats": ("resnet",), "bn-no-backward-reduce": ("resnet",)}
# (class, family) the torch plant does not reach, with why (said on the page; the JAX side plants it there)
NOT_PLANTED = {("tied-grad-once", "qwen2"): "the wrapper's untie does not reach transformers' Qwen2 tie here: "
                                            "its run was judged equal to the honest one (not investigated further)"}
RUNS = {
    "missing-1/N": ("ddp-ring", {}),
    "summed-twice": ("ddp", {}),
    "clip-shard-norm": ("zero3", {"clip": CLIP}),
    "accum-K-1": ("ddp", {"accum": 2}),
    "stale-grads": ("ddp", {}),
    "decay-one-shard": ("zero2", {}),
    "bucket-twice": ("ddp-bucket", {}),
    "bf16-reduction": ("ddp", {}),
    "bn-local-stats": ("ddp", {}),
    "bn-no-backward-reduce": ("ddp", {}),
    "lr-1.00001x": ("ddp", {}),
    "decay-skipped-once": ("ddp", {}),
    "adam-eps-1e-6": ("ddp", {}),
    "one-element": ("ddp", {}),
    "hsdp-wrong-axis": ("hsdp", {}),
    "zero-gather-offset": ("zero2", {}),
    "clip-before-reduce": ("zero2", {"clip": CLIP}),
    "loss-scale-kept": ("ddp", {}),
    "decay-wrong-set": ("ddp", {}),
    "adam-beta-typo": ("ddp", {}),
    "tied-grad-once": ("ddp", {}),
    "overlapping-rows": ("ddp", {}),
    "stale-micro-batch": ("ddp", {"accum": 2}),
    "bucket-missing-1/N": ("ddp-bucket", {}),
    "leaf-skipped": ("ddp", {}),
}


def case(name: str, model: str, dtype: str = "float32", steps: int = 4, devices: int = 2) -> dict:
    """The run bug `name` is planted in on transformers model `model`."""
    strategy, extra = RUNS[name]
    return {"model": model, "strategy": strategy, "dtype": dtype, "optimizer": "adamw", "steps": steps,
            "devices": devices, "accum": extra.get("accum", 1), "clip": extra.get("clip", 0.0)}


def families(name: str) -> tuple:
    """The transformers models class `name` is planted on: `FAMILIES` (GPT-2 and Llama by default), then the
    catalogue entry's `hf` families (`jax_hf_models.FAMILIES`, here as transformers' own classes)."""
    from . import BY_NAME

    found = dict.fromkeys(FAMILIES.get(name, DEFAULT) + tuple(BY_NAME[name].hf))
    return tuple(f for f in found if (name, f) not in NOT_PLANTED)


def cases(names, dtype: str = "float32", steps: int = 4, devices: int = 2) -> list:
    """[(name, case)] for every class of `names` on each of its families."""
    return [(n, case(n, m, dtype, steps, devices)) for n in names for m in families(n)]


def hf_model(name: str, dtype: str):
    """`hf_honest`'s model `name`, or transformers' own causal LM built from the catalogue's config of family
    `name` (`jax_hf_models.hf_config`: Qwen2 with its tied head, Mistral), with `hf_honest`'s vocabulary."""
    if name in hf_honest.PREFIX:
        return hf_honest.hf_model(name, dtype)
    import torch
    import transformers

    from .jax_hf_models import hf_config

    torch.manual_seed(0)
    config = hf_config(name)
    config.vocab_size = hf_honest.VOCAB
    model = transformers.AutoModelForCausalLM.from_config(config)
    return model.to(torch.float64 if dtype == "float64" else torch.float32)


def options(c: dict, n: int) -> dict:
    strategy = c["strategy"]
    if strategy == "hsdp":
        return {"replicas": 2 if n % 2 == 0 else 1}
    return {"bucket_mb": BUCKET_MB} if strategy in ("ddp", "ddp-bucket") else {}


def settings(c: dict) -> dict:
    """The settings the run means to train with (the Recorder's meta: what the user believes, also where a
    bug changed the optimizer it built): `hf_honest.optimizer`'s, torch's defaults."""
    if c["optimizer"] in ("adamw", "adam"):
        return {"name": c["optimizer"], "lr": hf_honest.LR[c["optimizer"]], "betas": (0.9, 0.999), "eps": 1e-8,
                "weight_decay": 0.01 if c["optimizer"] == "adamw" else 0.0, "clip_norm": c["clip"]}
    return {"name": c["optimizer"], "lr": hf_honest.LR[c["optimizer"]], "clip_norm": c["clip"],
            **({"momentum": 0.9} if c["optimizer"] == "momentum" else {})}


def record(c: dict, rank: int, n: int) -> tuple[dict, dict]:
    """One run of case `c` on this rank (its rows: `data.part_rows`, the project's one layout): rank 0's
    (meta, arrays)."""
    import torch

    import torch_ref
    from jaxdp.core.run import data

    name, dtype = c["model"], c["dtype"]
    model, opt = torch_ref.parallelize(hf_model(name, dtype), strategy=c["strategy"], accum=c["accum"],
                                       optimizer=lambda ps: hf_honest.optimizer(c["optimizer"], ps), **options(c, n))
    meta = hf_honest.meta(c) | {"clip_norm": c["clip"], "accum": c["accum"]}
    with torch_ref.trace.Recorder(None, meta, model, strip_prefix=hf_honest.PREFIX.get(name, "model."),
                                  optimizer=settings(c)) as rec:
        rec.init()
        for k in range(1, c["steps"] + 1):
            x, y = hf_honest.batch(name, k, dtype)  # (tokens below hf_honest.VOCAB for every LM)
            xs, ys = (torch.from_numpy(data.part_rows(a, rank, n, c["accum"])) for a in (x, y))
            loss = torch_ref.train_step(model, opt, xs, ys, hf_honest.loss_fn, clip_norm=c["clip"])
            rec.step(k, loss, x, y)
    return rec.meta, rec.arrays


def world(rank: int, n: int, jobs: list) -> list:
    """Each job (case, bug name or None) in order, the bug planted around its run: rank 0's (meta, arrays)."""
    from . import inject

    if any(c["dtype"] == "float64" for c, _ in jobs):
        hf_honest.promoted_sites()
    out = []
    for c, bug in jobs:
        with inject("torch", bug) if bug else _nothing():
            out.append(record(c, 0, 1) if c["strategy"] == "single" else record(c, rank, n))
    return out if rank == 0 else [None] * len(out)


def _nothing():
    import contextlib

    return contextlib.nullcontext()


def run(jobs: list, n: int = 2, timeout_s: float = 900.0) -> list:
    """`world` over n spawned ranks: rank 0's (meta, arrays) per job."""
    from torch_ref.launch import launch

    return launch(world, n, jobs, timeout_s=timeout_s, pg_timeout_s=120)[0]


def located(bad: tuple, honest: tuple):
    """The judge's verdict on the bug's run against the honest one: (caught, first divergence or None, the
    report). The meta's optimizer settings (which some bugs change) are not compared: the arrays are."""
    from jaxdp.core.traces import trace
    from jaxdp.judge import divergence

    report = divergence.compare(trace.Trace(*bad), trace.Trace(*honest), check_config=False)
    return not report.ok, report.first, report


def single(c: dict) -> dict:
    """Case `c` under `single` (one rank, every row): the honest run's control."""
    return c | {"strategy": "single", "devices": 1}


def judge_all(names, dtype: str = "float32", steps: int = 4, n: int = 2) -> list[dict]:
    """Every class of `names` on each of its families (`judge`)."""
    return judge(cases(names, dtype, steps, n), n)


def judge(todo: list, n: int = 2, controls: bool = True) -> list[dict]:
    """Each (class name, case) of `todo`: [{'name', 'model', 'strategy', 'caught', 'where' (step, field, tensor),
    'detail', 'control'}], each bug's run judged against its honest run, all in one world of n ranks;
    `control`: the honest run's own verdict against `single` ('' when it passes: a check that fails the
    honest run would prove nothing by failing the bug's; None with `controls=False`: not run)."""
    honest = list({repr(c): c for _, c in todo}.values())
    refs = honest + (list({repr(single(c)): single(c) for c in honest}.values()) if controls else [])
    results = run([(c, None) for c in refs] + [(c, name) for name, c in todo], n)
    by_case = {repr(c): r for c, r in zip(refs, results, strict=False)}
    out = []
    for (name, c), bad in zip(todo, results[len(refs):], strict=True):
        caught, first, report = located(bad, by_case[repr(c)])
        failed, control, _ = located(by_case[repr(c)], by_case[repr(single(c))]) if controls else (None, None, None)
        out.append({"name": name, "model": c["model"], "strategy": c["strategy"], "caught": caught,
                    "where": (first.step, first.field, first.name) if first else None,
                    "detail": first.describe() if first else "; ".join(report.failures[:1]),
                    "control": None if failed is None else (control.describe() if control else "failed") if failed
                    else ""})
    return out


def table(results: list[dict]) -> str:
    """`judge`'s results as a markdown table: class, model, strategy, caught, the first divergence, control."""
    lines = ["| bug | model | strategy | caught | first divergence (step, field, tensor) | honest vs single |",
             "|---|---|---|---|---|---|"]
    for r in results:
        where = ", ".join(map(str, r["where"])) if r["where"] else "none"
        control = "pass" if r["control"] == "" else "not run" if r["control"] is None else f"fails: {r['control']}"
        lines.append(f"| {r['name']} | {r['model']} | {r['strategy']} | {'yes' if r['caught'] else 'NO'} | "
                     f"{where} | {control} |")
    return "\n".join(lines)


PAGE = """# Mutations on transformers models, torch side

Generated by `{command}` (do not edit by hand; {seconds:.0f} s on 2 CPU cores).
Each bug class of the catalogue (docs/MUTATIONS.md) is planted in torch_ref (`tests/mutations/torch_bugs.py`,
`torch_sync_bugs.py`, `torch_step_bugs.py`: a monkeypatch of the function where the bug lives) and trained on
transformers' own models from tiny configs (nothing downloaded: GPT-2 with its tied head, Llama with grouped-query
attention and RMSNorm, the catalogue's Qwen2 and Mistral configs, ResNet with synchronised BatchNorm), through
`torch_ref.parallelize` and recorded with `torch_ref.trace.Recorder`, AdamW with torch's defaults, {dtype}, N = 2,
{steps} steps (`tests/mutations/hf_bugs.py`). The judge (`divergence.compare`, default bounds) compares
the bug's run with the honest run of the same strategy and model and names its first divergence; the last column
is the honest run's own verdict against `single` (the control).

**{caught} of {total} cases caught and located.** Not planted: {not_planted}.

{table}

## Where the torch form of each new class shipped

{sources}
"""


def page(results: list[dict], command: str, seconds: float, dtype: str, steps: int) -> str:
    from . import torch_sources

    sources = "\n".join(f"- **{name}**: {torch_sources.cite(name)}" for name in torch_sources.TORCH)
    return PAGE.format(command=command, seconds=seconds, dtype=dtype, steps=steps, table=table(results),
                       caught=sum(r["caught"] for r in results), total=len(results), sources=sources,
                       not_planted="; ".join(f"{c} on {f}: {why}" for (c, f), why in NOT_PLANTED.items()))


def _bad_input(args) -> str:
    """One line naming the flag, its value and the fix; '' when the flags are good."""
    unknown = [n for n in args.only.split(",") if n not in RUNS]
    if unknown:
        return f"--only {unknown[0]!r} is not a class: give some of {', '.join(RUNS)}"
    if not args.steps.isdigit() or not 1 <= int(args.steps) <= 20:
        return f"--steps {args.steps!r} is not a number of steps from 1 to 20: give one, e.g. --steps 4"
    if args.dtype not in ("float32", "float64"):
        return f"--dtype {args.dtype!r} is not float32 or float64: give one of them"
    return ""


def main(argv=None) -> int:
    """`python -m tests.mutations.hf_bugs [--only NAME,...] [--steps K] [--dtype D] [--out PAGE]`: every
    torch plant on its transformers models, judged; prints the table (or writes the page); exit 1 when a class
    is missed."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m tests.mutations.hf_bugs")
    parser.add_argument("--only", default=",".join(RUNS), help="the classes, comma-separated")
    parser.add_argument("--steps", default="4")
    parser.add_argument("--dtype", default="float32", help="float32 or float64")
    parser.add_argument("--out", default=None, help="write the page (e.g. docs/MUTATIONS_HF.md)")
    args = parser.parse_args(argv)
    bad = _bad_input(args)
    if bad:
        print(bad)
        return 2
    args.steps = int(args.steps)
    import sys
    import time

    start = time.time()
    results = judge_all(args.only.split(","), args.dtype, args.steps)
    if args.out:
        command = " ".join(["python -m tests.mutations.hf_bugs", *(argv if argv is not None else sys.argv[1:])])
        from jaxdp.core.files import atomic

        atomic.write_text(args.out, page(results, command, time.time() - start, args.dtype, args.steps))
    print(table(results))
    return 0 if all(r["caught"] for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
