"""Every strategy the command line lists, through every command that runs one: `train`, `memory`, `inspect`,
`inspect --target` (single per model; the others in one invocation: an XLA:GPU compile is seconds) and `compare`.
Each runs (exit 0) or is refused in one line (exit 2, in REFUSED with its reason), never a traceback: `single`
donates its state, and `memory` read it after its step ("Array has been deleted"); `inspect --target` typed
single's one-device batch `@data` (a ShardingTypeError in the embedding's gather). The names come from the lists
the CLI's choices are built from (`cli.JAX`, `cli.BOTH`)."""
from __future__ import annotations

import pytest

from jaxdp.core.run import targets
from jaxdp.harness import cli

TINY = ["--hidden", "8", "--batch-size", "16"]
N = 2  # every strategy but single (its one device); hsdp: 2 groups of 1 with --replicas 2
REFUSED = {("inspect --target", "ddp-pmap"): "jax.pmap compiles only for devices attached to this process",
           ("inspect --target", "diloco"): "the ahead-of-time build does not make diloco's per-replica state"}


def devices(strategy: str) -> list[str]:
    return ["--devices", "1" if strategy == "single" else str(N)] + (["--replicas", "2"] * (strategy == "hsdp"))


def answer(argv, capsys) -> tuple[int, str, str]:
    """(exit status, stderr, stdout) of `jaxdp argv`, in this process; a refusal is one line, never a traceback."""
    try:
        code = cli.main(argv)
    except SystemExit as e:  # argparse
        code = e.code
    out, err = capsys.readouterr()
    assert "Traceback" not in err, err
    if code == 2:
        assert len(err.strip().splitlines()) == 1, err
    return code, err, out


def expect(command: str, strategy: str, code: int, err: str) -> None:
    if (command, strategy) in REFUSED:
        assert code == 2 and REFUSED[command, strategy] in err, err
    else:
        assert code == 0, err


@pytest.mark.parametrize("strategy", cli.JAX)
@pytest.mark.parametrize("command", ["train", "memory", "inspect"])
def test_each_command_runs_every_strategy(command, strategy, capsys):
    steps = ["--steps", "2"] if command == "train" else []
    code, err, _ = answer([command, "--strategy", strategy, *devices(strategy), *TINY, *steps], capsys)
    expect(command, strategy, code, err)


needs_extra = pytest.mark.skipif(not targets.extra_installed(), reason='needs pip install -e ".[gpu-aot]"')
GPT = ["--model", "gpt", "--data", "text", "--n-layer", "1", "--d-model", "16", "--n-head", "2", "--seq-len", "8",
       "--batch-size", "8"]


@needs_extra
@pytest.mark.parametrize("model", [GPT, [*TINY, "--accum", "2"]], ids=["gpt", "mlp-accum-2"])
def test_inspect_target_compiles_single_on_its_one_gpu(model, capsys):
    """The GPU ahead-of-time path (docs/GPU.md) for single: the gpt's embedding gather failed (ShardingTypeError),
    and the accumulation loop over micro-batches typed `@data` (ValueError: 0th dimension ... replicated)."""
    code, err, _ = answer(["inspect", "--target", "h100", "--strategy", "single", "--devices", "1", *model], capsys)
    assert code == 0, err


@needs_extra
@pytest.mark.parametrize("strategy", [s for c, s in REFUSED if c == "inspect --target"])
def test_inspect_target_refuses_in_one_line(strategy, capsys):
    code, err, _ = answer(["inspect", "--target", "h100", "--strategy", strategy, *devices(strategy)], capsys)
    expect("inspect --target", strategy, code, err)


@needs_extra
@pytest.mark.slow
def test_inspect_target_compiles_every_other_strategy_in_one_invocation(capsys):
    """Every other strategy in one invocation (an XLA:GPU compile of the mlp takes ~3 s, of the 1-layer gpt
    ~14 s on 2 busy cores: the mlp, accumulating over 2 micro-batches; 44 s for the 11 from the CLI)."""
    names = [s for s in cli.JAX if s != "single" and ("inspect --target", s) not in REFUSED]
    argv = ["inspect", "--target", "h100", "--strategies", ",".join(names), "--devices", str(N), "--replicas", "2"]
    code, err, out = answer(argv + [*TINY, "--accum", "2"], capsys)
    assert code == 0, err
    assert out.count(f"target: {N} x NVIDIA H100") == len(names) == len(cli.JAX) - 1 - len(REFUSED), out


@pytest.mark.slow
def test_compare_runs_every_strategy_in_one_invocation_and_single_apart(tmp_path, capsys):
    """All of compare's strategies but single at once on N devices, then single on its own (on one device, as
    compare runs it); single with the others on N devices is refused in one line."""
    others = [s for s in cli.BOTH if s != "single"]
    mixed, err, _ = answer(["compare", "--strategies", ",".join(cli.BOTH), "--devices", str(N), *TINY], capsys)
    assert mixed == 2 and "compare single apart (--strategies single)" in err, err
    for names in (others, ["single"]):
        argv = ["compare", "--strategies", ",".join(names), "--steps", "2", "--out", str(tmp_path / names[0]), *TINY]
        code, err, _ = answer(argv + ["--devices", str(N), "--replicas", "2"] * (names != ["single"]), capsys)
        assert code == 0, err


@pytest.mark.parametrize("names", ["single", "single,ddp"])
def test_compare_refuses_single_on_several_devices_before_any_work(names, tmp_path, capsys):
    """`compare --strategies single --devices 2` printed its "loading JAX" progress line, then the refusal: two
    lines, after the first step of work. Now one line, first, alone or with others."""
    argv = ["compare", "--strategies", names, "--devices", "2", "--out", str(tmp_path / "r")]
    code, err, _ = answer(argv, capsys)
    assert code == 2 and "loading JAX" not in err and "--devices 1" in err, err


def test_bare_memory_measures_on_compares_devices_so_zero_shards_save(capsys):
    """`jaxdp memory` with no --devices ran on 1 device, where ZeRO's shards are whole and save nothing; it now
    takes compare's default (cli.COMPARE_DEVICES), and single in the list still runs on its one device."""
    parser = cli.build_parser()
    assert parser.parse_args(["memory"]).devices == parser.parse_args(["compare"]).devices == cli.COMPARE_DEVICES
    code, err, out = answer(["memory", "--strategies", "single,ddp,zero3", *TINY], capsys)
    assert code == 0, err
    rows = {line.split()[0]: line.split() for line in out.splitlines()[2:]}
    assert [rows[s][1] for s in ("single", "ddp", "zero3")] == ["1", str(cli.COMPARE_DEVICES), str(cli.COMPARE_DEVICES)]
    assert int(rows["zero3"][2]) < int(rows["ddp"][2])  # zero3's parameters: a shard of 1/4 (padded)
