"""Sizes checked before work (jaxdp/core/memory/fits.py, docs/RELIABILITY.md): each oversized or unusual input of
issue 38 is refused by both command lines in one line (exit 2) with the figure and the fix, in this
process, before any device, process or model is made (the work raises `Ran`); `--force` lets each one
through, and honest sizes run. The machine is fixed (23 GiB available, 2 cores, no GPU) so that the table
reads the same on every machine; one row holds a GPU's memory instead."""
from __future__ import annotations

import re

import pytest

from jaxdp.core.process import machine
from tests.cli.test_bad_input import call

GIB = 2**30
LLAMA_1B = "train --strategy {} --devices 8 --batch-size 8 --model llama --data tokens --d-model 1024 --n-layer 24 " \
           "--n-head 16 --seq-len 8"
HUGE = {  # argv -> its refusal, as a regular expression
    "train --batch-size 1000000000000": r"this run needs about 924 TiB \(per simulated CPU device x 1: parameters "
    r"27 KiB, AdamW state 54 KiB, gradients 27 KiB, activations 618 TiB; on the host: the batch 306 TiB, 1 process "
    r"200 MiB\); this machine has 23 GiB available: lower --batch-size to 24100625 or less \(or pass --force\)$",
    "train --preset gpt2-124m": r"needs about 99 GiB .*activations 97 GiB.*has 23 GiB available: lower --batch-size "
    r"to 13 or less",
    "train --model gpt --data text --d-model 1000000": r"needs about 350 TiB \(.*parameters 87 TiB.*even --batch-size "
    r"1 does not fit; use a smaller model \(lower --d-model, --n-layer or --seq-len\)",
    "memory --model gpt2 --data tokens --d-model 65536 --n-head 8 --n-layer 48": r"--strategy ddp: this run needs "
    r"about 145 TiB \(per simulated CPU device x 4",  # memory's default: compare's 4 devices
    "inspect --model gpt2 --data tokens --d-model 1000000 --n-head 8": r"needs about 350 TiB",
    "train --hidden 1000000000": r"needs about 879 GiB .*use a smaller model \(lower --hidden\)",
    "torch_ref train --devices 64": r"--devices 64 starts 64 torch_ref ranks on this machine's 2 core\(s\); at most "
    r"16 \(8 per core\): use --devices 16 or fewer \(or pass --force\)$",
    "train --devices 100000 --batch-size 100000": r"--devices 100000: at most 128 simulated CPU devices on this "
    r"machine's 2 core\(s\) \(64 per core\); use --devices 128 or fewer",
    "compare --preset gpt2-124m --devices 4": r"--strategy ddp: this run needs about 105 GiB \(per simulated CPU "
    r"device x 4: .*lower --batch-size to 8 or less \(a multiple of devices x accum = 4\)",
    "parity --batch-size 1000000000000": r"--strategy single: this run needs about 924 TiB",
    "train --processes 64 --devices 64": r"--processes 64 starts 64 processes .* at most 16",
    "train --model gpt2 --data tokens --seq-len 1000000": r"needs about 955 TiB",
    "torch_ref train --devices 100000 --batch-size 100000": r"--devices 100000 starts 100000 torch_ref ranks",
    "torch_ref train --hidden 1000000000 --devices 2": r"needs about 1.5 TiB \(per torch_ref rank x 2: .*2 processes "
    r"400 MiB",
    LLAMA_1B.format("ddp"): r"needs about 49 GiB .*: use --strategy zero3 \(parameters, gradients and optimizer state "
    r"sharded\) \(or pass --force\)$",
    "train --platform gpu --model llama --data tokens --d-model 4096 --n-layer 32 --n-head 32 --n-kv-head 8 "
    "--seq-len 8 --batch-size 1": r"needs about 91 GiB per GPU \(parameters 23 GiB, AdamW state 45 GiB, gradients "
    r"23 GiB, activations 67 MiB\); each GPU has 80 GiB",
}
HONEST = ["train", "train --preset gpt2-124m --batch-size 8", "compare --devices 4", "torch_ref train --devices 16",
          "train --devices 128 --batch-size 128", LLAMA_1B.format("zero3"),
          "inspect --preset gpt2-124m"]  # inspect compiles the step and runs none: no activations held


@pytest.fixture
def small_machine(monkeypatch):
    """23 GiB available, 2 cores, no GPU (80 GiB when --platform gpu)."""
    monkeypatch.setattr(machine, "available_bytes", lambda meminfo=None: 23 * GIB)
    monkeypatch.setattr(machine, "cores", lambda: 2)
    monkeypatch.setattr(machine, "gpu_present", lambda: False)
    monkeypatch.setattr(machine, "gpu_bytes", lambda: 80 * GIB)
    monkeypatch.delenv("WORLD_SIZE", raising=False)


def _run(line: str, tmp, monkeypatch, capsys):
    words = line.split()
    prog, argv_ = ("torch_ref", words[1:]) if words[0] == "torch_ref" else ("jaxdp", words)
    return prog, call(prog, argv_, tmp, monkeypatch, capsys)


@pytest.mark.parametrize("line", list(HUGE))
def test_a_run_that_cannot_fit_is_one_line_with_the_figure_and_the_fix(line, small_machine, tmp_path, monkeypatch,
                                                                        capsys):
    prog, (code, out) = _run(line, tmp_path, monkeypatch, capsys)
    assert code == 2 and out.err.count("\n") == 1 and "Traceback" not in out.err, (line, code, out.err)
    assert out.err.startswith(f"{prog}: error: ") and "--force" in out.err, out.err
    assert re.search(HUGE[line], out.err), (line, out.err)
    code, out = _run(line + " --force", tmp_path, monkeypatch, capsys)[1]
    assert code == "ran", (line, out.err)  # --force: the work is reached


@pytest.mark.parametrize("line", HONEST)
def test_honest_sizes_run(line, small_machine, tmp_path, monkeypatch, capsys):
    code, out = _run(line, tmp_path, monkeypatch, capsys)[1]
    assert code == "ran", (line, out.err)
