"""The command line: each bad input gives its one clear error (asserted by message), and a real
`jaxdp train` in a fresh process sets up its own simulated devices and writes a valid trace."""
from __future__ import annotations

import os
import subprocess
import sys

import jax
import pytest

from jaxdp.core.process import xla_flags
from jaxdp.core.traces import trace
from jaxdp.harness import cli
from tests.conftest import BASE, run


def error_of(argv, capsys, status: int = 2) -> str:
    """The one line `jaxdp argv` answers with exit `status` (2 bad input, 3 a failed run or file)."""
    try:
        code = cli.main(argv)
    except SystemExit as e:  # argparse
        code = e.code
    assert code == status
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("flag,value,valid", [
    ("--strategy", "zero9", "ddp-ring"), ("--model", "resnet", "gpt"),
    ("--optimizer", "lion", "adamw"), ("--dtype", "float16", "bfloat16"), ("--data", "mnist", "digits")])
def test_unknown_names_list_the_valid_ones(flag, value, valid, capsys):
    err = error_of(["train", flag, value], capsys)
    assert f"invalid choice: '{value}'" in err and valid in err


def test_strategy_of_the_other_framework_says_which_side_lacks_it(capsys):
    err = error_of(["train", "--strategy", "ddp-naive"], capsys)
    assert "strategy 'ddp-naive' exists only in torch_ref; jaxdp has: single, dp" in err


def test_batch_that_does_not_divide_names_valid_sizes(capsys):
    err = error_of(["train", "--devices", "4", "--accum", "3", "--batch-size", "50"], capsys)
    assert "--batch-size 50 does not divide by devices x accum = 4 x 3 = 12; valid sizes near it: 48, 60" in err


def test_more_devices_than_jax_has(capsys):
    have = len(jax.devices())  # initialises JAX (8 devices, from conftest): the count is now fixed
    err = error_of(["train", "--devices", str(2 * have), "--batch-size", "64"], capsys)
    assert f"already initialised with {have} CPU device(s)" in err
    assert f"xla_force_host_platform_device_count={2 * have}" in err


def test_gpu_platform_without_a_gpu_suggests_cpu(capsys, monkeypatch):
    """JAX made to see no GPU (on a GPU machine too, so the check runs everywhere)."""
    devices = jax.devices

    def no_gpu(backend=None):
        if backend == "gpu":
            raise RuntimeError("Unknown backend gpu")
        return devices(backend)

    monkeypatch.setattr(jax, "devices", no_gpu)
    err = error_of(["train", "--platform", "gpu", "--devices", "2"], capsys)
    assert "no GPU" in err and "--platform cpu" in err


def test_nan_loss_stops_with_the_step(capsys):
    # lr 1e38 makes float32 parameters overflow after one step: the loss of step 2 is inf.
    err = error_of(["train", "--optimizer", "sgd", "--lr", "1e38", "--dtype", "float32", "--steps", "5",
                    "--strategy", "single"], capsys, status=3)
    assert "loss is inf at step 2" in err and "--clip-norm" in err


def test_corrupt_and_missing_traces(tmp_path, capsys):
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"PK\x03\x04 not really a zip")
    assert "corrupt or truncated" in error_of(["diff", str(bad), str(bad)], capsys, status=3)
    assert "no such file" in error_of(["diff", str(tmp_path / "none.npz"), str(bad)], capsys)


def test_diff_refuses_traces_of_different_configs(tmp_path, capsys):
    a = run(BASE.replace(strategy="single", devices=1, optimizer="adam"))
    b = run(BASE.replace(strategy="single", devices=1, optimizer="sgd"))
    trace.save(tmp_path / "a.npz", a.meta, a.arrays)
    trace.save(tmp_path / "b.npz", b.meta, b.arrays)
    err = error_of(["diff", str(tmp_path / "a.npz"), str(tmp_path / "b.npz")], capsys)
    assert "optimizer: 'adam' vs 'sgd'" in err


def test_train_in_a_fresh_process_writes_a_trace_equal_to_single(tmp_path):
    """`python -m jaxdp train --devices 4` must set up 4 simulated devices itself."""
    cfg = BASE.replace(strategy="ddp-ring", devices=4, steps=3, batch_size=24, optimizer="momentum")
    path = tmp_path / "ring.npz"
    argv = [sys.executable, "-m", "jaxdp", "train", "--trace", str(path), "--hidden", "16,16"]
    for key in ("strategy", "devices", "steps", "batch_size", "optimizer", "lr", "weight_decay", "dtype", "seed"):
        argv += ["--" + key.replace("_", "-"), str(getattr(cfg, key))]
    env = xla_flags.for_child(os.environ)
    out = subprocess.run(argv, capture_output=True, text=True, timeout=180, env=env)
    assert out.returncode == 0, out.stderr
    assert "ddp-ring on 4 cpu device(s)" in out.stdout
    got = trace.load(path)
    assert got.meta["framework"] == "jax" and got.meta["devices"] == 4 and "jax" in got.meta["versions"]
    ref = run(cfg.replace(strategy="single", devices=1))
    worst = trace.diff(got, trace.Trace(ref.meta, ref.arrays))["worst"]
    assert max(worst.values()) < 1e-12, worst
    assert got.arrays["step/3/param/layers/0/kernel"].shape == (32, 16)  # Flax layout [in, out]


def test_trace_path_that_cannot_be_written_fails_before_training(tmp_path, capsys):
    (tmp_path / "afile").write_text("")
    err = error_of(["train", "--steps", "50", "--trace", str(tmp_path / "afile" / "x.npz")], capsys)
    assert err.startswith("jaxdp: error: --trace ") and "is a file, not a folder" in err and err.count("\n") == 1
    assert "choose a path under a folder" in err


def test_processes_that_do_not_divide_the_devices_fail_before_starting_any(capsys):
    err = error_of(["train", "--processes", "3", "--devices", "4"], capsys)
    assert err == ("jaxdp: error: --devices 4 does not divide over --processes 3 (each process holds the same "
                   "number of devices); use --processes 1, 2, 4, or --devices 6\n")
    assert "started process" not in err


NO_TORCH = "import sys; sys.modules['torch'] = None; from {module} import main; sys.exit(main({argv!r}))"
INSTALL_HINT = ("needs PyTorch, which is not installed: pip install -c constraints-cpu.txt -e '.[torch]' "
                "(in a clone of jaxdp), or pip install 'jaxdp[torch]'\n")


@pytest.mark.parametrize("module,argv,prefix", [
    ("jaxdp.harness.cli", ["compare", "--out", "{tmp}"], "jaxdp: error: jaxdp compare "),
    ("jaxdp.harness.cli", ["parity", "--strategies", "ddp"], "jaxdp: error: jaxdp parity "),
    ("jaxdp.harness.cli", ["bench", "--quick", "--out", "{tmp}"], "jaxdp: error: jaxdp bench "),
    ("jaxdp.harness.torch_cli", ["train", "--steps", "1"], "torch_ref: error: python -m torch_ref ")])
def test_commands_that_need_torch_say_which_extra_to_install(module, argv, prefix, tmp_path):
    """Run as if torch were not installed (an import of it fails): one line, no traceback."""
    argv = [a.format(tmp=tmp_path) for a in argv]
    proc = subprocess.run([sys.executable, "-c", NO_TORCH.format(module=module, argv=argv)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == prefix + INSTALL_HINT
