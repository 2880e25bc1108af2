"""`--kernels` through every command (jaxdp/harness/kernel_paths.py, docs/KERNELS.md "In compare and bench"):
train, parity, inspect and memory take one path into their RunConfig; compare and bench a list, each framework
run on each path. The spies stop each command where its configuration leaves the command line (no run), and
one real `jaxdp parity --kernels fused` shows the path in both frameworks' traces."""
from __future__ import annotations

import pytest

from jaxdp.harness import cli

GPT = ["--model", "gpt", "--data", "text", "--n-layer", "1", "--n-head", "2", "--d-model", "16", "--seq-len", "16",
       "--batch-size", "8", "--steps", "2"]


class Stop(Exception):
    """Raised by a spy: the command got as far as its run."""


def spy(monkeypatch, module, name: str) -> list:
    """Replace `module.name` by a function recording its arguments and stopping the command."""
    seen = []

    def record(*args, **kwargs):
        seen.append((args, kwargs))
        raise Stop

    monkeypatch.setattr(module, name, record)
    return seen


def run_until_spied(argv) -> None:
    with pytest.raises(Stop):
        cli.main(argv)


@pytest.mark.quick
@pytest.mark.parametrize("path", ["mirrored", "fused"])
def test_train_inspect_memory_take_one_path_into_their_config(path, monkeypatch):
    from jaxdp.analysis import accounting
    from jaxdp.analysis import inspect as inspect_mod
    from jaxdp.harness import cli_train

    seen = spy(monkeypatch, cli_train, "_run")
    run_until_spied(["train", "--kernels", path, *GPT])
    assert [c.kernels for c in seen[0][0][0]] == [path]
    seen = spy(monkeypatch, inspect_mod, "main")
    run_until_spied(["inspect", "--kernels", path, "--devices", "2", *GPT[:-2]])
    assert seen[0][0][0].kernels == path
    seen = spy(monkeypatch, accounting, "memory")
    run_until_spied(["memory", "--kernels", path, "--devices", "2", "--platform", "cpu", *GPT[:-2]])
    assert seen[0][0][0].kernels == path


@pytest.mark.quick
def test_parity_runs_both_frameworks_on_the_path_given(monkeypatch):
    from jaxdp.harness import pair_runs

    seen = spy(monkeypatch, pair_runs, "check")
    run_until_spied(["parity", "--kernels", "fused", "--strategies", "single", *GPT])
    base, pairs = seen[0][0]
    assert base.kernels == "fused" and pairs == [("single", "single", "single")]


@pytest.mark.quick
@pytest.mark.parametrize("given, first, further", [((), "mirrored", ()), (("--kernels", "mirrored,fused"),
                                                                          "mirrored", ("fused",)),
                                                   (("--kernels", "fused"), "fused", ())])
def test_compare_takes_a_list_the_first_path_is_the_reports(given, first, further, monkeypatch):
    from jaxdp.harness.report import runner

    seen = spy(monkeypatch, runner, "compare")
    run_until_spied(["compare", *given, "--strategies", "ddp", "--devices", "2", "--platform", "cpu", *GPT])
    (cfg, names), kwargs = seen[0]
    assert cfg.kernels == first and kwargs["kernels"] == further and names == ["ddp"]


@pytest.mark.quick
@pytest.mark.parametrize("given, kernels, compiled", [((), ("mirrored", "fused"), False),
                                                      (("--kernels", "fused", "--compile"), ("fused",), True)])
def test_bench_times_each_path_given_both_by_default(given, kernels, compiled, monkeypatch, tmp_path):
    from jaxdp.harness import bench

    seen = spy(monkeypatch, bench, "run")
    run_until_spied(["bench", "--quick", *given, "--out", str(tmp_path / "b")])
    assert seen[0][1]["kernels"] == kernels and seen[0][1]["compile"] is compiled


@pytest.mark.quick
@pytest.mark.parametrize("argv, message", [
    (["train", "--kernels", "mirrored,fused"], "invalid choice: 'mirrored,fused'"),
    (["compare", "--kernels", "fast"], "unknown kernels 'fast' (choose from mirrored, fused"),
    (["bench", "--kernels", "fused,fused"], "names a path twice"),
    (["compare", "--kernels", "mirrored,fused", "--dtype", "float64"], "--kernels fused has no float64 path")])
def test_a_bad_path_is_one_line_before_any_work(argv, message, capsys):
    try:
        code = cli.main(argv)
    except SystemExit as e:
        code = e.code
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and message in err, err


def test_parity_fused_path_reaches_both_traces(monkeypatch, capsys):
    """A real run: both frameworks' traces say fused, and torch's says which attention it ran."""
    from jaxdp.harness import pair_runs

    metas = []
    for name in ("run_jax", "run_torch"):
        real = getattr(pair_runs, name)

        def kept(*args, _real=real, **kwargs):
            out = _real(*args, **kwargs)
            metas.extend(r.meta for r in (out.values() if isinstance(out, dict) else [out]))
            return out
        monkeypatch.setattr(pair_runs, name, kept)
    assert cli.main(["parity", "--kernels", "fused", "--strategies", "single", "--dtype", "float32", *GPT]) == 0
    assert [(m["framework"], m["kernels"]) for m in metas] == [("torch", "fused"), ("jax", "fused")]
    assert "fused" in str(metas[0]["kernels_detail"]) and "kernels fused" in capsys.readouterr().out
