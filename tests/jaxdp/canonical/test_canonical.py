"""`--reduction canonical` (issue 16): every array of the trace (loss, grads, params, per step) is
bitwise equal (`np.array_equal`) to `single`'s, for every strategy and variant, N in {1, 2, 4, 8},
float32 / bfloat16 / float64, accumulation 1 and 3, clipping on and off (and hsdp at R x S = 2 x 4 and
4 x 2, `HSDP_CASES`), on two models (the MLP and
the GPT, whose softmax is where XLA's simplifier differed). The default set has every value of every
dimension (each variant once, the N and the (dtype, accum, clip) combinations cycling: 14 checks);
JAXDP_CANONICAL_FULL=1 runs the pairwise covering set instead (every pair of values of any two
dimensions: 52 checks, about 5 minutes on 2 cores, too long for the default suite).

The checks are shown to fail: `native` at N = 1 and N = 4 is not bitwise equal (so equality is not a
coincidence of the test), nor is canonical with the tree replaced by a left fold, with XLA's
common-subexpression elimination left on (GPT), with the simplifier forced on where a scalar of the
optimizer's update has a lone broadcast (the cnn), or with the mean's division and the clip unfenced (the mlp); with
JAXDP_CANONICAL_FULL=1 also with fused multiply-adds left on (Adam's moments): each compiler setting
canonical makes is needed.

All runs happen in one subprocess (tests/canonical_runs.py): canonical needs XLA:CPU's fused
multiply-adds off from the start of the process, which this test session does not have. Its
processes compile as `jaxdp train` does (the session's JAX_DISABLE_MOST_OPTIMIZATIONS, LLVM at -O0,
is removed from their environment): the bits are claimed for the machine code that runs.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from jaxdp import strategies
from jaxdp.core.run.config import ConfigError, RunConfig
from tests import REPO
from tests.pairwise import pairwise

BASE = RunConfig(model="mlp", data="synthetic", hidden=(16, 16), steps=2, batch_size=48, lr=0.05,
                 optimizer="adamw", weight_decay=0.01, seed=3, reduction="canonical", shards=8)
GPT = BASE.replace(model="gpt", data="text", n_layer=1, d_model=64, n_head=2, seq_len=32, batch_size=16)  # width 64
# and 32 tokens: the size at which an unfenced recomputation (models/dot_fold.py) changed the bits on 1 device
VARIANTS = {  # name -> RunConfig changes
    "dp": {"strategy": "dp"}, "ddp": {"strategy": "ddp"}, "ddp-pmap": {"strategy": "ddp-pmap"},
    "ddp-bucket": {"strategy": "ddp-bucket", "bucket_mb": 0.001}, "ddp-ring": {"strategy": "ddp-ring"},
    "zero1": {"strategy": "zero1"}, "zero1-ring": {"strategy": "zero1", "collectives": "ring"},
    "zero2": {"strategy": "zero2"}, "zero2-ring": {"strategy": "zero2", "collectives": "ring"},
    "zero3": {"strategy": "zero3"}, "zero3-ring": {"strategy": "zero3", "collectives": "ring"},
    "zero3-keep": {"strategy": "zero3", "reshard_after_forward": False},
}
HSDP = {"hsdp": {"strategy": "hsdp"}, "hsdp-ring": {"strategy": "hsdp", "collectives": "ring"}}  # + replicas
HSDP_CASES = [{"variant": "hsdp", "devices": 8, "replicas": 2, "dtype": "float32", "accum": 3, "clip_norm": 0.05},
              {"variant": "hsdp-ring", "devices": 8, "replicas": 4, "dtype": "bfloat16", "accum": 1, "clip_norm": 0.0}]
DIMS = {"variant": list(VARIANTS), "devices": [1, 2, 4, 8], "dtype": ["float32", "bfloat16", "float64"],
        "accum": [1, 3], "clip_norm": [0.0, 0.05]}
GPT_CASES = [{"variant": "ddp", "devices": 2}, {"variant": "zero3", "devices": 8}]
# `--model gpt2`: GPT-2's layout as users write it (a tied token embedding and head, fused qkv), AdamW; zero3 at N = 2
# holds the gathered model through its 4 shards a device, zero1 at N = 4 updates flat shards.
GPT2 = GPT.replace(model="gpt2")
GPT2_CASES = [{"variant": "zero3", "devices": 2}, {"variant": "zero1", "devices": 4}]
CNN = BASE.replace(model="cnn", data="digits", channels=(2, 3))  # sync BatchNorm: canonical statistics
CNN_CASES = [{"variant": "ddp", "devices": 4, "dtype": "float32", "accum": 3, "clip_norm": 0.05},
             {"variant": "zero3", "devices": 8, "dtype": "bfloat16", "accum": 1, "clip_norm": 0.0},
             {"variant": "ddp-pmap", "devices": 2, "dtype": "float64", "accum": 3, "clip_norm": 0.0}]  # its
# reference is BN_RUNS' bn-canonical: one run serves both (clipping's two values: the cases above)


def _config(base, case) -> RunConfig:
    changes = {k: v for k, v in case.items() if k != "variant"}
    return base.replace(**(VARIANTS | HSDP)[case["variant"]], **changes)


def _name(model, case) -> str:
    return model + "-" + "-".join(f"{k}={v}" for k, v in case.items())


def _single(cfg: RunConfig) -> RunConfig:
    return cfg.replace(strategy="single", devices=1, collectives="xla", reshard_after_forward=True, bucket_mb=25.0,
                       replicas=1)


COMBOS = [("float32", 1, 0.0), ("bfloat16", 3, 0.05), ("float64", 1, 0.05), ("float32", 3, 0.05),
          ("bfloat16", 1, 0.0), ("float64", 3, 0.0)]


def each_value() -> list[dict]:
    """Every variant once, with N and the (dtype, accum, clip) combination cycling: every value of
    every dimension appears, and every variant meets a sharded N."""
    return [dict(variant=v, devices=DIMS["devices"][(i + 1) % 4], **dict(zip(("dtype", "accum", "clip_norm"),
                                                                              COMBOS[i % len(COMBOS)], strict=True)))
            for i, v in enumerate(VARIANTS)]


def _plan():
    """(runs: name -> (config, mutate), checks: name -> its reference's name)."""
    runs, checks = {}, {}
    gpt = [{**c, "dtype": "float32", "accum": 1, "clip_norm": 0.05} for c in GPT_CASES]
    gpt2 = [{**c, "dtype": "float32", "accum": 1, "clip_norm": 0.05} for c in GPT2_CASES]
    full = os.environ.get("JAXDP_CANONICAL_FULL") == "1"  # FULL: below
    mlp = pairwise(DIMS) if full else each_value()
    cnn = each_value() if full else CNN_CASES
    for model, base, cases in (("mlp", BASE, mlp + HSDP_CASES), ("gpt", GPT, gpt), ("gpt2", GPT2, gpt2),
                               ("cnn", CNN, cnn)):
        for case in cases:
            cfg = _config(base, case)
            plain = {k: v for k, v in case.items() if k != "replicas"}  # hsdp's reference: the others' single
            name, ref = _name(model, case), _name(model, {**plain, "variant": "single", "devices": 1})
            runs[name], runs[ref] = (cfg, None), (_single(cfg), None)
            checks[name] = ref
    return runs, checks


RUNS, CHECKS = _plan()
F32 = BASE.replace(dtype="float32", clip_norm=0.05)
FULL = os.environ.get("JAXDP_CANONICAL_FULL") == "1"
MUTANTS = {  # name -> (config, mutation, reference run): each must NOT be bitwise equal to its reference
    "native-n4": (F32.replace(strategy="ddp", devices=4, reduction="native", shards=0), None, "native-n1"),
    "fold-n4": (F32.replace(strategy="ddp", devices=4), "fold", "fold-n1"),
}
MUTANT_REFS = {"native-n1": (_single(MUTANTS["native-n4"][0]), None), "fold-n1": (_single(F32), "fold")}
# Each of canonical's compiler settings is needed: without it, a check fails (docs/CANONICAL.md, "The simplifier
# on"): CSE on (the GPT's softmax on 2 devices), the simplifier forced on where a scalar of the update has a lone
# broadcast (the cnn's update under zero3), the mean and the clip unfenced (the mlp's, accumulation 3, zero3).
MUTATED = {"cse": (GPT.replace(strategy="ddp", devices=2, dtype="float32"), "gpt"),
           "simplifier": (CNN.replace(strategy="zero3", devices=8, dtype="bfloat16"), "cnn"),
           "unfenced": (F32.replace(strategy="zero3", devices=4, accum=3), "mlp")}
for _kind, (_cfg, _model) in MUTATED.items():
    MUTANTS[f"{_kind}-{_model}"] = (_cfg, _kind, f"{_kind}-{_model}-single")
    MUTANT_REFS[f"{_kind}-{_model}-single"] = (_single(_cfg), _kind)
# BatchNorm's canonical gradient is BatchNorm's gradient: float64, against native single; leaving the
# statistics' share out (`bn-direct`) must fail that.
BN_F64 = _single(CNN.replace(dtype="float64", accum=3))
BN_RUNS = {"bn-canonical": (BN_F64, None), "bn-native": (BN_F64.replace(reduction="native", shards=0), None),
           "bn-direct": (BN_F64, "bn-direct")}
# A checkpoint saved by zero3 on 4 devices after step 2, resumed by ddp-ring on 2: steps 3-4 are single's bits.
RESUME = F32.replace(steps=4, accum=3, dtype="float32")
RESUME_RUNS = {"resume-save": (RESUME.replace(strategy="zero3", devices=4, steps=2, checkpoint_dir="{out}/ck",
                                              checkpoint_every=2), None),
               "resume-load": (RESUME.replace(strategy="ddp-ring", devices=2, checkpoint_dir="{out}/ck", resume=True),
                               None),
               "resume-single": (_single(RESUME), None)}
# Two processes x 2 devices (jax.distributed) against single: zero2 and ddp, in one launch.
PROCESSES = F32.replace(devices=4, accum=3)
# ddp-pmap: with `single` ddp's program on one device, ddp itself agrees with it under FMA (2026-12-06); ddp-pmap,
# dp at N = 1 and the cnn's BatchNorm gradient under ddp-pmap and zero1-ring at N = 8 do not (7 of FULL's 65).
FMA_RUNS = {"fma-n2": F32.replace(strategy="ddp-pmap", devices=2), "fma-n1": _single(F32)} if FULL else {}


def _production_env() -> dict:
    return {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_DISABLE_MOST_OPTIMIZATIONS")}


def _distinct(runs: dict) -> tuple[dict, dict]:
    """(the runs with each (config, mutation) once, {name: the name it runs under}): two names for one
    run (a check's reference that is also another check's run) train once."""
    first, alias = {}, {}
    for name, (cfg, mutate) in runs.items():
        alias[name] = first.setdefault(json.dumps([cfg.to_dict(), mutate], sort_keys=True), name)
    return {name: runs[name] for name in first.values()}, alias


def _execute(runs: dict, out, extra=()) -> None:
    cases = [{"name": name, "config": cfg.to_dict(), "mutate": mutate} for name, (cfg, mutate) in runs.items()]
    path = out / f"cases{len(extra)}.json"
    path.write_text(json.dumps(cases))
    env = _production_env()
    proc = subprocess.run([sys.executable, "-m", "tests.canonical_runs", str(path), str(out), *extra],
                          capture_output=True, text=True, timeout=900, env=env,
                          cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    out = tmp_path_factory.mktemp("canonical")
    runs, alias = _distinct(RUNS | {k: (cfg, m) for k, (cfg, m, _) in MUTANTS.items()} | MUTANT_REFS | RESUME_RUNS
                            | BN_RUNS | {"processes-single": (_single(PROCESSES), None)})
    _execute(runs, out)
    if FMA_RUNS:
        _execute({k: (cfg, None) for k, cfg in FMA_RUNS.items()}, out, ["--allow-fma"])
    return lambda name: dict(np.load(out / f"{alias.get(name, name)}.npz"))


def _unequal(a: dict, b: dict) -> list[str]:
    assert set(a) == set(b) and any(k.startswith("step/") for k in a)
    return [k for k in a if not np.array_equal(a[k], b[k])]


@pytest.mark.parametrize("name", list(CHECKS))
def test_bitwise_equal_to_single(traces, name):
    got, ref = traces(name), traces(CHECKS[name])
    assert all(np.isfinite(v).all() for v in got.values() if v.dtype.kind == "f")
    assert _unequal(got, ref) == []


@pytest.mark.parametrize("name", list(MUTANTS) + list(FMA_RUNS)[:1])
def test_the_check_fails_without_each_part(traces, name):
    ref = MUTANTS[name][2] if name in MUTANTS else "fma-n1"
    assert _unequal(traces(name), traces(ref)), f"{name}: bitwise equal, so the check could not fail"


def _worst_relative(a: dict, b: dict) -> dict:
    """Per float array of the steps: max |a - b| / max |b| (NaN if either has a non-finite value)."""
    out = {}
    for k in b:
        if k.startswith("step/") and b[k].dtype.kind == "f":
            scale = np.max(np.abs(b[k])) or 1.0
            out[k] = float(np.max(np.abs(a[k] - b[k])) / scale)
    return out


def test_canonical_batchnorm_is_batchnorms_gradient(traces):
    """float64: canonical BatchNorm (statistics, their share of the gradient, running statistics) is
    native BatchNorm's step to 1e-12 relative, every array; without the share, the gradient is off."""
    worst = _worst_relative(traces("bn-canonical"), traces("bn-native"))
    # np.max, not max(): a NaN anywhere is the result, and NaN fails both comparisons
    assert len(worst) > 20 and np.max(list(worst.values())) <= 1e-12, worst
    broken = _worst_relative(traces("bn-direct"), traces("bn-native"))
    assert np.max([v for k, v in broken.items() if "/grad/" in k]) > 1e-6, broken


def test_layout_refuses_a_batchnorm_it_cannot_give_statistics_to():
    from flax import nnx

    from jaxdp import models
    from jaxdp.canonical import batchnorm
    from jaxdp.core.run import data

    model = nnx.Sequential(nnx.Linear(3, 4, rngs=nnx.Rngs(0)), nnx.BatchNorm(4, rngs=nnx.Rngs(0)))
    problem = models.from_module(model, models.cross_entropy)
    x, y = np.zeros((8, 3), np.float32), np.zeros(8, np.int32)
    with pytest.raises(ConfigError, match="needs jaxdp's BatchNorm"):
        batchnorm.layout(problem.loss_fn, problem.params, x, y, shards=4)
    cnn = models.init(CNN, data.load(CNN.data, CNN.seed))
    counts = batchnorm.layout(cnn.loss_fn, cnn.params, np.zeros((6, 64), np.float32), y[:6], shards=4)
    assert counts == [6 * 64 * 4, 6 * 64 * 4]  # rows x H x W x S, per layer


def test_resume_in_another_layout_keeps_the_bits(traces):
    resumed, full = traces("resume-load"), traces("resume-single")
    keys = [k for k in resumed if k.startswith("step/")]
    assert keys and {int(k.split("/")[1]) for k in keys} == {3, 4}
    assert [k for k in keys if not np.array_equal(resumed[k], full[k])] == []


def test_two_processes_give_the_bits_of_one_device(traces, tmp_path):
    argv = [sys.executable, "-m", "jaxdp", "train", "--strategy", "zero2,ddp", "--processes", "2", "--timeout", "300",
            "--trace", str(tmp_path / "{strategy}.npz"), "--hidden", "16,16", "--reduction", "canonical"]
    for key in ("devices", "steps", "batch_size", "accum", "optimizer", "lr", "weight_decay", "clip_norm", "dtype",
                "seed", "shards"):
        argv += ["--" + key.replace("_", "-"), str(getattr(PROCESSES, key))]
    env = _production_env()
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=320, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ref = traces("processes-single")
    for strategy in ("zero2", "ddp"):
        got = dict(np.load(tmp_path / f"{strategy}.npz"))
        keys = [k for k in ref if k.startswith(("step/", "init/"))]
        assert keys and [k for k in keys if not np.array_equal(got[k], ref[k])] == [], strategy


@pytest.mark.parametrize("make, message", [
    (lambda: strategies.options("ddp", reduction="exact"), "reduction='exact'; valid: native, canonical"),
    (lambda: strategies.options("zero2", clip_norm=1.0), "are for reduction='canonical'"),
    (lambda: BASE.replace(shards=3).validate(), "shards=3: canonical reduction needs a power of two"),
    (lambda: BASE.replace(shards=64).validate(), "a micro-batch of 48 rows does not cut into shards=64"),
    (lambda: BASE.replace(strategy="ddp", devices=16, batch_size=64, shards=8).validate(),
     "on 16 devices needs n to divide shards=8"),
    (lambda: CNN.replace(batchnorm="local").validate(), "--reduction canonical needs --batchnorm sync"),
    (lambda: BASE.replace(reduction="native").validate(), "--shards is for --reduction canonical"),
])
def test_bad_input_is_one_line_naming_the_fix(make, message):
    with pytest.raises(ConfigError, match=re.escape(message)) as err:
        make()
    assert "\n" not in str(err.value)
