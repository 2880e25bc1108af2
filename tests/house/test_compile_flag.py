"""The suite compiles with XLA:CPU's older fusion emitters and one LLVM module per program (`FAST_COMPILE`, set by
the root conftest.py: 2.5x faster compiles). It must change nothing the suite's checks read from a compiled step:
the same collectives in the same order (kind, bytes, replica groups, times per step) and the same memory,
temporaries within 1%, as a process at XLA's defaults compiles for the same configurations (zero3's per-unit
gathers under accumulation, ddp-bucket's buckets, zero2's AdamW, hsdp's 2-D grid, fsdp-jit's partitioner). And the
emitters' flag must do something (the programs' texts differ), or this check could not fail; the one-module flag
changes no optimized HLO text (its sha256, compared for these five programs: docs/TESTS.md)."""
import json
import os
import subprocess
import sys

import pytest

from jaxdp.core.process import xla_flags
from tests import FAST_COMPILE, REPO
from tests.compiled_facts import facts

GPT = dict(model="gpt", data="text", n_layer=2, d_model=32, n_head=2, seq_len=16, batch_size=8)
MLP = dict(model="mlp", data="synthetic", hidden=(64, 64), batch_size=32)
CONFIGS = [dict(GPT, strategy="zero3", devices=4, accum=2), dict(MLP, strategy="ddp-bucket", bucket_mb=0.01, devices=4),
           dict(MLP, strategy="zero2", devices=4, optimizer="adamw"), dict(MLP, strategy="hsdp", devices=4, replicas=2),
           dict(GPT, strategy="fsdp-jit", devices=4, optimizer="adamw")]


@pytest.mark.skipif(FAST_COMPILE not in os.environ.get("XLA_FLAGS", ""),
                    reason="nothing to guard: no FAST_COMPILE in this session (conftest.py: jaxlib 0.10 only)")
def test_the_suites_compile_flag_changes_no_collective_and_under_1_percent_of_memory(tmp_path):
    path = tmp_path / "configs.json"
    path.write_text(json.dumps(CONFIGS))
    env = xla_flags.for_child(os.environ)
    env["XLA_FLAGS"] = env.get("XLA_FLAGS", "").replace(FAST_COMPILE, "").strip()
    proc = subprocess.run([sys.executable, "-m", "tests.compiled_facts", str(path)], capture_output=True, text=True,
                          timeout=300, env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    defaults = json.loads(proc.stdout.splitlines()[-1])
    for cfg, default in zip(CONFIGS, defaults, strict=True):
        ours = json.loads(json.dumps(facts(cfg)))  # as the other process's arrive: tuples as lists
        assert ours["lines"] != default["lines"], f"{cfg['strategy']}: the flag changed nothing: a vacuous check"
        assert ours["collectives"] == default["collectives"], cfg["strategy"]
        assert ours["memory"]["state_bytes"] == default["memory"]["state_bytes"], cfg["strategy"]
        for key in ("temp_bytes", "peak_bytes"):
            assert abs(ours["memory"][key] - default["memory"][key]) <= 0.01 * default["memory"][key], (cfg, key)
