"""examples/, smoke-tested with `--quick`, each on what it teaches: the compare example names two strategies
and their parity verdicts, the GPT writes new characters after its prompt, the digits strategies agree
and reach one accuracy, two processes give the one-process trace; every example answers a bad flag with
a one-line error and no work. Run in this process (runpy, from another cwd) on the session's simulated
devices; the port examples are smoke-tested in tests/examples/test_port_example.py and
tests/torch_ref/test_hf_models.py."""
from __future__ import annotations

import ast
import os
import re
import runpy
import sys

import pytest

from tests import REPO

EXAMPLES = os.path.join(REPO, "examples")


def run_example(name: str, args: list[str], monkeypatch, capsys, cwd) -> tuple[int, str, str]:
    """`python examples/NAME ARGS` in this process, from `cwd`: (exit status, stdout, stderr)."""
    monkeypatch.chdir(cwd)
    monkeypatch.setattr(sys, "argv", [name, *args])
    try:
        runpy.run_path(os.path.join(EXAMPLES, name), run_name="__main__")
        code = 0
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    out, err = capsys.readouterr()
    return code, out, err


def test_compare_example_compares_two_strategies(monkeypatch, capsys, tmp_path):
    code, out, _ = run_example("compare_frameworks.py", ["--quick", "--out", "report"], monkeypatch, capsys, tmp_path)
    assert code == 0, out
    for strategy in ("ddp", "zero3"):
        assert re.search(rf"^  {strategy} +parity pass \(worst gradient difference ", out, re.M), out
    assert "zero3 holds 0.50x ddp's state per device and sends 1.50x its bytes" in out, out  # N = 2
    assert "verdict: the frameworks agree on every strategy" in out, out
    assert {"report.html", "report.md", "summary.json"} <= set(os.listdir(tmp_path / "report"))


def test_gpt_example_writes_a_continuation(monkeypatch, capsys, tmp_path):
    code, out, _ = run_example("train_gpt_text.py", ["--quick"], monkeypatch, capsys, tmp_path)
    assert code == 0, out
    prompt = ast.literal_eval(re.search(r"^prompt: +(.+)$", out, re.M).group(1))
    new = ast.literal_eval(re.search(r"^continuation: +('.*'|\".*\") \(", out, re.M).group(1))
    assert len(new) == 40 and new.strip(), out  # characters the model chose, not the prompt echoed
    assert len(prompt + new) > len(prompt) and "babbles" in out, out
    held = {s: float(k) for s, k in re.findall(r"^  (ddp|zero3) +holds per device: params +([\d.]+) KiB", out, re.M)}
    assert held["zero3"] == pytest.approx(held["ddp"] / 4, rel=0.05), out  # sharded over 4 devices


def test_digits_example_strategies_agree(monkeypatch, capsys, tmp_path):
    code, out, _ = run_example("train_mlp_digits.py", ["--quick"], monkeypatch, capsys, tmp_path)
    assert code == 0, out
    rows = re.findall(r"^  (\S+) +\|loss - ddp's\| (\S+)  \|param - ddp's\| (\S+)  accuracy ([\d.]+)%$", out, re.M)
    assert [r[0] for r in rows] == ["ddp", "ddp-ring", "zero2", "zero3"], out
    assert all(float(loss) <= 1e-6 and float(param) <= 1e-5 for _, loss, param, _ in rows), out
    assert len({acc for *_, acc in rows}) == 1 and float(rows[0][3]) > 50, out  # one accuracy, above chance


def test_multi_process_example_gives_the_one_process_trace(monkeypatch, capsys, tmp_path):
    code, out, _ = run_example("multi_process.py", ["--quick"], monkeypatch, capsys, tmp_path)
    assert code == 0, out
    losses = re.findall(r"^(1 process x 4|2 processes x 2) devices: +loss (\S+) -> (\S+)$", out, re.M)
    assert len(losses) == 2 and losses[0][1:] == losses[1][1:], out
    assert re.search(r"^param +\S+ .* ok$", out, re.M) and "MISMATCH" not in out, out
    assert "verdict: the same run, to float64 rounding" in out, out


BAD_FLAGS = [
    ("compare_frameworks.py", ["--quick", "--steps", "3"], "unrecognized arguments: --steps 3"),
    ("train_gpt_text.py", ["--chars", "0"], "argument --chars: must be at least 1, got 0"),
    ("train_mlp_digits.py", ["--quick", "--devices", "2"], "unrecognized arguments: --devices 2"),
    ("multi_process.py", ["--processes", "3"], "unrecognized arguments: --processes 3"),
    ("port_your_model.py", ["--strategy", "zero4"], "argument --strategy: invalid choice: 'zero4'"),
    ("port_your_model.py", ["--batch-size", "7"], "--batch-size 7 must be a multiple of --devices x --accum = 2"),
    ("port_hf_model.py", ["--devices", "0"], "argument --devices: must be at least 1, got 0"),
    ("port_hf_model.py", ["--plant-bug", "--steps", "1"], "--plant-bug perturbs after step 2: give --steps 2"),
]


@pytest.mark.parametrize("name", sorted(f for f in os.listdir(EXAMPLES) if f.endswith(".py")))
def test_help_lists_every_flag_with_its_default(name, monkeypatch, capsys, tmp_path):
    """`-h` on every example: each flag with its help and its default (ArgumentDefaultsHelpFormatter)."""
    code, out, _ = run_example(name, ["-h"], monkeypatch, capsys, tmp_path)
    flags = re.split(r"\n  (?=--)", out.split("options:", 1)[1])[1:]
    assert code == 0 and flags, out
    for flag in flags:
        assert "(default:" in flag and len(flag.split("  ", 1)[-1].split()) > 2, flag  # a help text and the default


@pytest.mark.parametrize("name,args,message", BAD_FLAGS, ids=[f"{n}{' '.join(a)}" for n, a, _ in BAD_FLAGS])
def test_a_bad_flag_is_one_line_before_any_work(name, args, message, monkeypatch, capsys, tmp_path):
    code, out, err = run_example(name, args, monkeypatch, capsys, tmp_path)
    errors = [line for line in err.splitlines() if "error:" in line]
    assert code == 2 and out == "" and len(errors) == 1 and message in errors[0], err
    assert os.listdir(tmp_path) == []  # nothing written
