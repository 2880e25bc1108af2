"""Every flag of every subcommand, in both frameworks, fed bad values generated from its parser: each is
answered before any work with exit 2 and one line naming the flag and the value, no traceback, nothing
written. The same table's good value in the same context reaches the work (so the check is not a
blanket refusal): `Ran` is raised where the first device, process, model or file would be made."""
from __future__ import annotations

import argparse
import os
import subprocess
import sys

import pytest

from jaxdp.core.run import readers, values
from jaxdp.harness import cli, torch_cli


class Ran(Exception):
    """The work was reached: every input had been accepted."""


WORK = ["jaxdp.devices.setup", "jaxdp.train.run", "jaxdp.launch.launch", "jaxdp.harness.torch_run.run",
        "jaxdp.analysis.inspect.main", "jaxdp.analysis.accounting.memory", "jaxdp.harness.bench.run",
        "jaxdp.core.traces.trace.load", "jaxdp.harness.cli_train._run"]
# The context in which a flag is read (model, data, strategy, companions) and a value it accepts there.
TRANSFORMER = ["--model", "gpt", "--data", "text"]
CONTEXT = {"channels": ["--model", "cnn", "--data", "digits"], "batchnorm": ["--model", "cnn", "--data", "digits"],
           "conv_bias": ["--model", "cnn", "--data", "digits"], "n_kv_head": ["--model", "llama", "--data", "text"],
           "d_ff": ["--model", "llama", "--data", "text"], "bucket_mb": ["--strategy", "ddp-bucket"],
           "collectives": ["--strategy", "zero3"], "reshard_after_forward": ["--strategy", "zero3"],
           "replicas": ["--strategy", "hsdp", "--devices", "4", "--batch-size", "64"],
           "hsdp_hosts": ["--strategy", "hsdp", "--devices", "4"], "shards": ["--reduction", "canonical"],
           "axis_type": ["--strategy", "fsdp-jit"],
           "inner_steps": ["--strategy", "diloco"], "outer_lr": ["--strategy", "diloco"],
           "outer_momentum": ["--strategy", "diloco"],
           "timeout": ["--processes", "2", "--devices", "2"], "heartbeat": ["--processes", "2", "--devices", "2"],
           "startup_timeout": ["--processes", "2", "--devices", "2"],
           "checkpoint_every": ["--checkpoint-dir", "{tmp}/ck"],
           "process_id": ["--coordinator", "h:1", "--num-processes", "2", "--devices", "2"],
           "num_processes": ["--coordinator", "h:1", "--process-id", "0", "--devices", "2"],
           "coordinator": ["--num-processes", "2", "--process-id", "0", "--devices", "2"],
           "processes": ["--devices", "2"]}
CONTEXT |= {k: TRANSFORMER for k in ("n_layer", "n_head", "d_model", "seq_len")}
CHECK_CONTEXT = {"inner_steps": ["--intent", "diloco"]}  # jaxdp check's flags read under one intent
CONTEXT["preset"] = ["--batch-size", "4", "--force"]  # GPT-2 small at the default 64 rows cannot fit a small machine
# (fits.py); 4 rows divide over compare's default 4 devices; --force: even 4 rows need about 14 GiB on 4 simulated
# devices, more than a 24 GiB machine has available while the other worker runs (a test of the flag, not of fits)
GOOD = {"steps": "1", "trace": "{tmp}/t.npz", "json": "{tmp}/i.json", "html": "{tmp}/d.html", "out": "{tmp}/out",
        "checkpoint_dir": "{tmp}/ck", "coordinator": "h:1", "process_id": "1", "num_processes": "2",
        "processes": "2", "devices": "2", "timeout": "60", "heartbeat": "30", "startup_timeout": "300",
        "replicas": "2", "tolerance": "1e-6", "preset": "gpt2-124m"}
PATHS = {"trace": "file", "json": "file", "html": "file", "out": "dir", "checkpoint_dir": "dir"}
TYPED = {"processes": 1, "num_processes": 1, "process_id": 0}  # int flags of the commands, and their minimum


def commands():
    """(program, subcommand, its parser) for every subcommand of jaxdp and torch_ref."""
    for prog, build in (("jaxdp", cli.build_parser), ("torch_ref", torch_cli.build_parser)):
        sub = next(a for a in build()._actions if isinstance(a, argparse._SubParsersAction))
        for name, parser in sub.choices.items():
            yield prog, name, parser


def flags():
    for prog, name, parser in commands():
        for action in parser._actions:
            if action.option_strings and action.dest not in ("help",):
                yield pytest.param(prog, name, action, id=f"{prog}-{name}-{action.option_strings[0]}")


def bad_values(action) -> list[str]:
    """Values `action` must refuse: wrong type, empty, out of range, NaN/Inf, the wrong kind of path."""
    if isinstance(action, argparse.BooleanOptionalAction) or action.nargs == 0:
        return []
    if action.dest in PATHS:
        braces = ["{tmp}/r{x}.npz"] if action.dest == "trace" else []  # only {strategy} is filled in
        return ["", "{tmp}/afile/x", *braces] + (["{tmp}/adir"] if PATHS[action.dest] == "file" else ["{tmp}/afile"])
    if action.choices:
        return ["bogus", ""]
    if action.type is values.int_list:
        return ["", "0", "8,,8", "x", "-8"]
    if action.type is values.bool_text:
        return ["maybe", ""]
    if action.dest == "strategies":
        return ["bogus", "", ","]
    if action.dest == "coordinator":
        return ["nohost", "h:0", ":1"]
    out = ["x", ""]
    rule = values.RULES.get(action.dest)
    if action.type is float:
        out += ["nan", "inf", "-inf", "-1"] if rule is None or rule.low >= 0 else ["nan", "inf"]
    if action.type is int:
        out += ["1.5"] + [str(TYPED.get(action.dest, rule.low if rule else 0) - 1)]
    if rule is not None and rule.kind is float and not rule.inclusive:
        out.append(str(rule.low))
    if rule is not None and rule.high is not None:
        out.append(str(int(rule.high) + 1))
    return out


def call(prog, argv_, tmp, monkeypatch, capsys):
    """Run the command in this process with the work replaced by `Ran`: (exit status or 'ran', stderr)."""
    for target in WORK:
        monkeypatch.setattr(target, lambda *a, **k: (_ for _ in ()).throw(Ran()))
    argv_ = [a.replace("{tmp}", str(tmp)) for a in argv_]
    capsys.readouterr()
    try:
        code = (cli.main if prog == "jaxdp" else torch_cli.main)(argv_)
    except SystemExit as e:
        code = e.code
    except Ran:
        code = "ran"
    return code, capsys.readouterr()


def base(prog, name, dest) -> list[str]:
    head = {"diff": ["diff", "{tmp}/a.npz", "{tmp}/b.npz"], "check": ["check", "{tmp}/step.py:make"]}.get(name, [name])
    launcher = dest in ("timeout", "heartbeat", "startup_timeout") and (prog, name) != ("jaxdp", "train")
    context = CHECK_CONTEXT.get(dest, []) if name == "check" else CONTEXT.get(dest, [])
    return head + ([] if launcher else context)  # --processes only in jaxdp train


@pytest.fixture
def tmp(tmp_path):
    (tmp_path / "afile").write_text("")
    (tmp_path / "adir").mkdir()
    for trace in ("a.npz", "b.npz"):
        (tmp_path / trace).write_bytes(b"")
    (tmp_path / "step.py").write_text("def make(devices):\n    raise AssertionError('not reached')\n")  # jaxdp check's
    return tmp_path


@pytest.mark.parametrize("prog,name,action", list(flags()))
def test_every_bad_value_is_one_line_before_any_work(prog, name, action, tmp, monkeypatch, capsys):
    flag = action.option_strings[0]
    before = sorted(p.name for p in tmp.rglob("*"))
    for value in bad_values(action):
        typed = [f"{flag}={value}"] if value.startswith("-") else [flag, value]  # as argparse needs it
        code, out = call(prog, base(prog, name, action.dest) + typed, tmp, monkeypatch, capsys)
        shown = value.replace("{tmp}", str(tmp))
        where = f"{prog} {name} {flag} {shown!r}"
        assert code == 2, f"{where}: exit {code}, stderr {out.err!r}"
        assert out.err.count("\n") == 1 and out.err.endswith("\n") and "Traceback" not in out.err, where
        assert out.err.startswith(f"{prog}"), (where, out.err)
        named = {flag, *action.option_strings, "trace A", "trace B"}
        assert any(f in out.err for f in named) or action.dest == "strategies", (where, out.err)
        assert not shown.strip() or shown.strip(",") == "" or shown in out.err, (where, out.err)
        assert out.out == "" and sorted(p.name for p in tmp.rglob("*")) == before, where
    good = GOOD.get(action.dest)
    if good is None or name in ("memory", "inspect") and action.dest == "devices":
        return
    code, out = call(prog, base(prog, name, action.dest) + [flag, good], tmp, monkeypatch, capsys)
    assert code == "ran", f"{prog} {name} {flag} {good}: refused {out.err!r}"


def read_by_none():
    """(command, flag, value, context): a flag that the chosen model or strategy does not read."""
    for name, models in readers.MODEL_FLAGS.items():
        flag = "--" + name.replace("_", "-")
        value = {"hidden": "8", "channels": "4,4", "batchnorm": "local", "conv_bias": "true"}.get(name, "2")
        model = ["--model", "mlp"] if "mlp" not in models else TRANSFORMER
        yield pytest.param("jaxdp", "train", flag, value, model, id=f"jaxdp-{flag}-model")
        yield pytest.param("torch_ref", "train", flag, value, model, id=f"torch_ref-{flag}-model")
    for name in readers.STRATEGY_FLAGS["jax"]:
        flag = "--" + name.replace("_", "-")
        value = {"collectives": "ring", "reshard_after_forward": "false", "hsdp_hosts": "replica",
                 "axis_type": "explicit"}.get(name, "2")
        for prog, framework in (("jaxdp", "jax"), ("torch_ref", "torch")):
            other = next(s for s in ("dp", "ddp-ring", "ddp") if s not in readers.STRATEGY_FLAGS[framework][name])
            yield pytest.param(prog, "train", flag, value, ["--strategy", other], id=f"{prog}-{flag}-strategy")
    yield pytest.param("jaxdp", "compare", "--bucket-mb", "2", ["--strategy", "zero3"], id="compare-bucket")
    yield pytest.param("jaxdp", "train", "--shards", "4", [], id="shards-native")
    yield pytest.param("jaxdp", "inspect", "--json", "{tmp}/r{x}.json", [], id="inspect-json-braces")
    yield pytest.param("jaxdp", "inspect", "--json", "{tmp}/one.json", ["--strategy", "ddp,zero3"],
                       id="inspect-json-two")
    yield pytest.param("jaxdp", "train", "--n-layer", "2", ["--preset", "gpt2-124m"], id="preset-clash")
    for name in ("memory", "inspect"):
        for flag in cli.NO_RUN:
            yield pytest.param("jaxdp", name, "--" + flag.replace("_", "-"), "1", [], id=f"{name}-{flag}")


@pytest.mark.parametrize("prog,name,flag,value,context", list(read_by_none()))
def test_a_flag_the_run_does_not_read_is_refused(prog, name, flag, value, context, tmp, monkeypatch, capsys):
    code, out = call(prog, [name] + context + [flag, value], tmp, monkeypatch, capsys)
    assert code == 2 and out.err.count("\n") == 1 and flag in out.err, out.err


def test_readers_agree_with_the_strategies_own_option_tables():
    """core/run/readers.py (read before any framework loads) says what the strategies themselves take."""
    from jaxdp import strategies as jax_strategies
    pytest.importorskip("torch")
    from torch_ref import strategies as torch_strategies

    for framework, table in (("jax", jax_strategies.OPTIONS), ("torch", torch_strategies.OPTIONS)):
        for name, readers_ in readers.STRATEGY_FLAGS[framework].items():
            assert set(readers_) == {s for s, opts in table.items() if name in opts}, (framework, name)


def test_shared_flags_mean_the_same_in_both_frameworks():
    """The run flags, --strategy and --trace: the same names, types, defaults and help on both sides."""
    def table(parser):
        return {a.dest: (tuple(a.option_strings), a.default, a.type, a.help) for a in parser._actions}

    (jax_train,) = [p for prog, n, p in commands() if (prog, n) == ("jaxdp", "train")]
    (torch_train,) = [p for prog, n, p in commands() if prog == "torch_ref"]
    ours, theirs = table(jax_train), table(torch_train)
    shared = set(ours) & set(theirs) - {"strategies", "help", "_parser", "trace", "timeout"}
    assert len(shared) > 30 and all(ours[d] == theirs[d] for d in shared)
    assert theirs["strategies"][0] == ours["strategies"][0] == ("--strategy", "--strategies")


def test_a_missing_gpu_is_one_line_before_any_rank(tmp, monkeypatch, capsys):
    """The machine, checked before work: torch_ref --platform gpu where torch sees no GPU (made so on a GPU
    machine too, so the check runs everywhere)."""
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    code, out = call("torch_ref", ["train", "--devices", "2", "--platform", "gpu"], tmp, monkeypatch, capsys)
    assert code == 2 and out.err.count("\n") == 1 and "--platform gpu: torch sees no GPU" in out.err, out.err


@pytest.mark.parametrize("argv_", [
    ["-m", "jaxdp", "train", "--lr", "nan"],
    ["-m", "jaxdp", "compare", "--strategy", "zero3", "--hidden", "8,,8"],
], ids=["jaxdp-lr-nan", "compare-hidden"])
def test_a_real_process_answers_in_one_line(argv_, tmp_path):
    run = subprocess.run([sys.executable] + argv_, capture_output=True, text=True, timeout=120, cwd=tmp_path,
                         env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert run.returncode == 2 and run.stdout == "" and run.stderr.count("\n") == 1, run.stderr
    assert run.stderr.startswith(("jaxdp", "torch_ref")) and not list(tmp_path.iterdir()), run.stderr
