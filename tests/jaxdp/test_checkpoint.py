"""Checkpoints (orbax): resume reproduces the uninterrupted run bit for bit, reshards across
device counts, survives SIGKILL (a torn write is never loaded), and refuses what it cannot use."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from jaxdp import checkpoint, train
from jaxdp.core.files import ckpt_folder, manifest
from jaxdp.core.process import xla_flags
from tests.conftest import BASE, run
from tests.helpers import assert_bitwise_equal, resumed_steps

CFG = BASE.replace(devices=4, steps=6, optimizer="adamw", clip_norm=0.5, batch_size=24)


def steps_equal(resumed, full, exact=True, tol=1e-12):
    """Checkpointed at step 3: the resumed run's steps 4 on equal the uninterrupted run's."""
    resumed_steps(resumed, full, first=4, exact=exact, tol=tol)


def checkpoint_at_3(cfg, tmp_path):
    folder = str(tmp_path / "ck")
    train.run(cfg.replace(steps=3, checkpoint_dir=folder, checkpoint_every=3), progress=False)
    return folder


@pytest.mark.parametrize("strategy", ["ddp", "zero2", "zero3", "ddp-pmap"])
def test_resume_reproduces_the_uninterrupted_run_bit_for_bit(strategy, tmp_path):
    cfg = CFG.replace(strategy=strategy)
    folder = checkpoint_at_3(cfg, tmp_path)
    resumed = train.run(cfg.replace(checkpoint_dir=folder, resume=True), record=True, progress=False)
    assert resumed.meta["first_step"] == 4
    steps_equal(resumed, run(cfg))


@pytest.mark.parametrize("saved,resumed_as", [(("zero3", 4), ("zero3", 2)), (("ddp", 4), ("ddp", 1)),
                                              (("zero3", 4), ("ddp", 3))])
def test_resume_reshards_to_other_device_counts(saved, resumed_as, tmp_path):
    folder = checkpoint_at_3(CFG.replace(strategy=saved[0], devices=saved[1]), tmp_path)
    cfg = CFG.replace(strategy=resumed_as[0], devices=resumed_as[1], checkpoint_dir=folder, resume=True)
    resumed = train.run(cfg, record=True, progress=False)
    steps_equal(resumed, run(CFG.replace(strategy=saved[0], devices=saved[1])), exact=False)


def test_a_torn_checkpoint_is_never_loaded(tmp_path):
    """A save interrupted before orbax's final rename leaves `<step>.orbax-checkpoint-tmp`: it must be
    ignored, and the last complete step loaded."""
    cfg = CFG.replace(strategy="zero2")
    folder = checkpoint_at_3(cfg, tmp_path)
    ckpt_folder.begin_step(folder, "jax", 5)  # as a save does before its first file
    torn = os.path.join(folder, "5.orbax-checkpoint-tmp")
    shutil.copytree(os.path.join(folder, "3"), torn)
    for root, _, files in os.walk(torn):
        for name in files:
            with open(os.path.join(root, name), "r+b") as f:
                f.truncate(max(0, os.path.getsize(os.path.join(root, name)) // 2))
    resumed = train.run(cfg.replace(checkpoint_dir=folder, resume=True), record=True, progress=False)
    assert resumed.meta["first_step"] == 4
    steps_equal(resumed, run(cfg))


def _intact(folder) -> list[int]:
    """The steps of `folder` whose files match their manifest."""
    if not os.path.isdir(folder):
        return []
    return [s for s in ckpt_folder.steps(folder) if manifest.problem(os.path.join(folder, str(s))) is None]


def test_sigkill_mid_training_resumes_from_the_last_complete_checkpoint(tmp_path):
    folder = str(tmp_path / "ck")
    cfg = CFG.replace(strategy="zero2")
    argv = [sys.executable, "-m", "jaxdp", "train", "--strategy", "zero2", "--devices", "4", "--steps", "100000",
            "--batch-size", "24", "--hidden", "16,16", "--optimizer", "adamw", "--clip-norm", "0.5",
            "--lr", str(cfg.lr), "--weight-decay", str(cfg.weight_decay), "--dtype", "float64", "--seed", str(cfg.seed),
            "--checkpoint-dir", folder, "--checkpoint-every", "1"]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=xla_flags.for_child(os.environ))
    try:
        deadline = time.monotonic() + 120
        while (
            time.monotonic() < deadline
            and len(_intact(folder)) < 2  # a step's manifest is written right after orbax's rename
        ):
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)  # saves dominate each step here: usually lands mid-save
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    listed, complete = ckpt_folder.steps(folder), _intact(folder)
    assert len(complete) >= 2
    last = complete[-1]
    for torn in listed[listed.index(last) + 1:]:  # killed between orbax's rename and the manifest: refused
        shutil.rmtree(os.path.join(folder, str(torn)))  # on resume as damaged; the fix its message names
    resumed = train.run(cfg.replace(steps=last + 2, checkpoint_dir=folder, resume=True), record=True, progress=False)
    assert resumed.meta["first_step"] == last + 1
    full = run(cfg.replace(steps=last + 2))
    for k in [k for k in resumed.arrays if k.startswith("step/")]:
        assert_bitwise_equal(resumed.arrays[k], full.arrays[k], k)


def test_checkpoint_of_another_config_names_the_mismatch(tmp_path):
    folder = checkpoint_at_3(CFG.replace(strategy="ddp"), tmp_path)
    with pytest.raises(
        checkpoint.CheckpointError, match=r"another configuration: hidden: checkpoint \[16, 16\], run \[8, 8\]"
    ):
        train.run(CFG.replace(strategy="ddp", hidden=(8, 8), checkpoint_dir=folder, resume=True), progress=False)
    with pytest.raises(checkpoint.CheckpointError, match="optimizer: checkpoint 'adamw', run 'sgd'"):
        train.run(CFG.replace(strategy="ddp", optimizer="sgd", checkpoint_dir=folder, resume=True), progress=False)


def test_missing_and_corrupt_checkpoints(tmp_path):
    with pytest.raises(checkpoint.CheckpointError, match="no checkpoint directory"):
        train.run(CFG.replace(checkpoint_dir=str(tmp_path / "nothing"), resume=True), progress=False)
    os.makedirs(tmp_path / "empty")
    with pytest.raises(checkpoint.CheckpointError, match="no complete checkpoint"):
        train.run(CFG.replace(checkpoint_dir=str(tmp_path / "empty"), resume=True), progress=False)
    folder = checkpoint_at_3(CFG.replace(strategy="ddp"), tmp_path)
    for root, _, files in os.walk(os.path.join(folder, "3", "state")):
        for name in files:
            with open(os.path.join(root, name), "wb") as f:
                f.write(b"garbage")
    with pytest.raises(checkpoint.DamagedCheckpoint, match="damaged") as caught:
        train.run(CFG.replace(strategy="ddp", checkpoint_dir=folder, resume=True), progress=False)
    line = str(caught.value)  # one short line ending in the fix, whatever orbax's message was
    assert "\n" not in line and len(line) < 200 + len(folder) + 150 and line.endswith("without --resume"), line


def test_running_statistics_resume_across_layouts(tmp_path):
    """cnn's BatchNorm running statistics are part of the checkpoint: saved by zero3 on 2 devices,
    resumed by ddp on 3, every later step's params and `state/` equal the uninterrupted run."""
    cnn = CFG.replace(model="cnn", data="digits", hidden=(16, 16), optimizer="adam", clip_norm=0.0)
    folder = checkpoint_at_3(cnn.replace(strategy="zero3", devices=2), tmp_path)
    resumed = train.run(cnn.replace(strategy="ddp", devices=3, checkpoint_dir=folder, resume=True), record=True,
                        progress=False)
    assert any("/state/" in k for k in resumed.arrays)
    steps_equal(resumed, run(cnn.replace(strategy="zero3", devices=2)), exact=False)
