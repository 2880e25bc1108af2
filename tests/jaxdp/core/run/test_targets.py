"""--target's inputs (jaxdp/core/run/targets.py) and the size guard held against the target's memory (fits.py)."""
from __future__ import annotations

import pytest

from jaxdp.core.memory import fits
from jaxdp.core.run import targets
from jaxdp.core.run.config import ConfigError, RunConfig
from jaxdp.harness import cli

LLAMA_8B = RunConfig(preset="llama3-8b", devices=8, batch_size=8, dtype="bfloat16")


def test_target_without_the_extra_is_one_line_naming_it(monkeypatch, capsys):
    monkeypatch.setattr(targets.importlib.util, "find_spec", lambda name: None)
    assert cli.main(["inspect", "--target", "h100", "--devices", "8"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and 'pip install -c constraints-cpu.txt -e ".[gpu-aot]"' in err


@pytest.mark.parametrize("argv,words", [
    (["memory", "--nodes", "2"], "--nodes is for --target"),
    (["inspect", "--target", "h100", "--devices", "8", "--nodes", "3"], "--devices 8 does not divide over --nodes 3"),
    (["inspect", "--target", "h100", "--devices", "8", "--strategy", "ddp-pmap"], "use --strategy ddp"),
    (["memory", "--target", "h100", "--devices", "8", "--model", "cnn", "--data", "digits"], "use --model mlp"),
    (["memory", "--nodes", "0"], "--nodes 0: give a whole number of nodes >= 1"),
    # a node holds 8 GPUs (the target's `node_gpus`): more on one node is refused, naming the --nodes to give
    (["inspect", "--target", "h100", "--devices", "16", "--nodes", "1"],
     "--devices 16 on --nodes 1 puts 16 GPUs on a node; a node of H100s holds at most 8: give --nodes 2"),
    (["memory", "--target", "b200", "--devices", "100000"], "of B200s holds at most 8: give --nodes 12500"),
    (["compare", "--target", "h100", "--devices", "17"], "give --nodes 17"),  # 17 divides over no fewer nodes
    (["memory", "--target", "a100", "--devices", "64", "--nodes", "4"], "--devices 64 on --nodes 4 puts 16")])
def test_bad_target_input_is_one_line_before_any_work(argv, words, monkeypatch, capsys):
    monkeypatch.setattr(targets, "extra_installed", lambda: True)  # the checks after the extra's
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and words in err


def test_nodes_for_is_the_fewest_nodes_of_at_most_a_node_each():
    assert [targets.nodes_for(n, 8) for n in (1, 8, 9, 12, 16, 17, 24, 100000)] == [1, 1, 3, 2, 2, 17, 3, 12500]
    assert all(targets.TARGETS[t].node_gpus == 8 for t in ("h100", "h200", "a100", "b200"))


def test_the_size_guard_holds_a_target_run_against_the_targets_memory_not_the_hosts():
    est_host, device, _ = fits.need(LLAMA_8B.replace(strategy="ddp"), "jax", target="h100")
    assert device > targets.TARGETS["h100"].memory_bytes > 2**36  # ddp's parameters, grads and Adam: over 80 GB
    assert est_host < 2**30  # the host holds no parameter (compiled from shapes): the batch and a process
    with pytest.raises(ConfigError, match="each H100 has 79 GiB: use --strategy zero3"):
        fits.check_fit([LLAMA_8B.replace(strategy="ddp")], "jax", target="h100")
    fits.check_fit([LLAMA_8B.replace(strategy="zero3")], "jax", target="h100")  # zero3's shards fit
    fits.check_fit([LLAMA_8B.replace(strategy="ddp")], "jax", target="h100", device_check=False)  # memory reports
    fits.check_fit([LLAMA_8B.replace(strategy="ddp")], "jax", target="h200")  # 141 GB holds it


def test_llama3_8b_preset_has_llama_3_8b_parameters():
    from jaxdp.core.memory import sizes

    assert sizes.parameters(LLAMA_8B) == 8_030_261_248  # Meta's count for Llama 3 8B
