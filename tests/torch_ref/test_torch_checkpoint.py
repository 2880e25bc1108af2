"""torch_ref checkpoints (torch.distributed.checkpoint), mirroring tests/jaxdp/test_checkpoint.py: resume
reproduces the uninterrupted run bit for bit, reshards across world sizes, survives SIGKILL (a torn
write is never loaded), and refuses what it cannot use with a clear message.

Cost: one 4-rank world runs every strategy's full / checkpointed / resumed runs; one 2-rank world
the zero3 4 -> 2 reshard and the resume after SIGKILL; the rest runs in the pytest process (one rank)."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from jaxdp.core.files import ckpt_folder
from jaxdp.harness import torch_run
from tests import REPO
from tests.helpers import assert_bitwise_equal, resumed_steps
from tests.torch_helpers import BASE, init_for, init_key, train_jobs
from torch_ref import checkpoint
from torch_ref.launch import launch

CFG = BASE.replace(devices=4, steps=6, optimizer="adamw", clip_norm=0.5, batch_size=24)
BIT_FOR_BIT = ["ddp", "zero1", "zero2", "zero3"]
KILLED = CFG.replace(strategy="zero2", devices=2)


def steps_equal(resumed, full, first=4, exact=True, tol=1e-12):
    """The resumed run recorded exactly steps `first`..the last, each equal to the uninterrupted run's."""
    steps = resumed_steps(resumed, full, first, exact=exact, tol=tol)
    assert steps == set(range(first, resumed.cfg.steps + 1)), sorted(steps)


def _job(cfg, record=True):
    return cfg, init_for(init_key(cfg)), record


# ---- fixtures -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("torch_ck")


@pytest.fixture(scope="module")
def four(folder):
    """On 4 ranks, per strategy: the uninterrupted 6-step run, a 3-step run saving at step 3, and
    the run resumed from it. {strategy: (full, resumed, checkpoint dir)}."""
    jobs, dirs = [], {}
    for s in BIT_FOR_BIT:
        cfg = CFG.replace(strategy=s)
        dirs[s] = str(folder / s)
        jobs += [_job(cfg), _job(cfg.replace(steps=3, checkpoint_dir=dirs[s], checkpoint_every=3), record=False),
                 _job(cfg.replace(checkpoint_dir=dirs[s], resume=True))]
    out = launch(train_jobs, 4, jobs, timeout_s=300, pg_timeout_s=60)[0]
    return {s: (out[3 * i], out[3 * i + 2], dirs[s]) for i, s in enumerate(BIT_FOR_BIT)}


@pytest.fixture(scope="module")
def killed(folder):
    """`python -m torch_ref train --devices 2 --checkpoint-every 1`, killed with SIGKILL (the launcher
    and its ranks: the whole process group) once two checkpoints are complete. Returns the folder."""
    ck = str(folder / "killed")
    argv = [sys.executable, "-m", "torch_ref", "train", "--strategy", "zero2", "--devices", "2", "--steps", "100000",
            "--batch-size", str(KILLED.batch_size), "--hidden", "16,16", "--optimizer", "adamw", "--clip-norm", "0.5",
            "--lr", str(KILLED.lr), "--weight-decay", str(KILLED.weight_decay), "--dtype", "float64",
            "--seed", str(KILLED.seed), "--platform", "cpu",
            "--checkpoint-dir", ck, "--checkpoint-every", "1"]
    tmp = folder / "tmp"  # the launcher's heartbeat and progress files: SIGKILL leaves them, here and not in /tmp
    tmp.mkdir()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                            cwd=REPO, env=os.environ | {"TMPDIR": str(tmp)})
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None and len(
                checkpoint.step_dirs(ck) if os.path.isdir(ck) else []) < 2:
            time.sleep(0.02)
        os.killpg(proc.pid, signal.SIGKILL)  # saves dominate each step here: often lands mid-save
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    return ck


@pytest.fixture(scope="module")
def two(four, killed):
    """On 2 ranks: zero3 resumed from the 4-rank checkpoint; the killed run resumed, and its
    uninterrupted twin."""
    last = checkpoint.step_dirs(killed)[-1]
    jobs = [_job(CFG.replace(strategy="zero3", devices=2, checkpoint_dir=four["zero3"][2], resume=True)),
            _job(KILLED.replace(steps=last + 2, checkpoint_dir=killed, resume=True)),
            _job(KILLED.replace(steps=last + 2))]
    out = launch(train_jobs, 2, jobs, timeout_s=300, pg_timeout_s=60)[0]
    return {"zero3": out[0], "killed": (last, out[1], out[2])}


# ---- tests --------------------------------------------------------------------------------------
@pytest.mark.parametrize("strategy", BIT_FOR_BIT)
def test_resume_reproduces_the_uninterrupted_run_bit_for_bit(strategy, four):
    full, resumed, _ = four[strategy]
    assert resumed.meta["first_step"] == 4 and full.meta["first_step"] == 1
    assert len(resumed.losses) == len(resumed.step_times) == 3
    for k in [k for k in full.arrays if k.startswith("step/3/param/")]:  # init/ = what it resumed from
        assert_bitwise_equal(resumed.arrays[k.replace("step/3/param/", "init/")], full.arrays[k], k)
    steps_equal(resumed, full)


def test_the_record_holds_step_config_world_and_rng(four):
    from jaxdp import checkpoint as jax_checkpoint

    assert checkpoint.RECORD_FIELDS == jax_checkpoint.RECORD_FIELDS
    path = os.path.join(four["zero3"][2], "3")
    with open(os.path.join(path, checkpoint.RECORD)) as f:
        record = json.load(f)
    seen = (record["step"], record["strategy"], record["devices"], record["config"]["hidden"])
    assert seen == (3, "zero3", 4, [16, 16])
    assert len(record["rng_state"]) > 100
    # Sharded state is written sharded: one file per rank, and no .partial left behind.
    assert sorted(f for f in os.listdir(path) if f.endswith(".distcp")) == [f"__{r}_0.distcp" for r in range(4)]
    assert sorted(os.listdir(four["zero3"][2])) == ["3", ckpt_folder.MARKER]


def test_zero3_resumes_on_fewer_ranks(four, two):
    """zero3 saved on 4 ranks resumes on 2 and matches the 4-rank run to 1e-12 (float64)."""
    assert two["zero3"].meta["first_step"] == 4
    steps_equal(two["zero3"], four["zero3"][0], exact=False)


def test_ddp_resumes_on_one_rank(four):
    resumed = torch_run.run(CFG.replace(strategy="ddp", devices=1, checkpoint_dir=four["ddp"][2], resume=True),
                            record=True)
    steps_equal(resumed, four["ddp"][0], exact=False)


def test_sigkill_mid_training_resumes_from_the_last_complete_checkpoint(two):
    last, resumed, full = two["killed"]
    assert last >= 2
    assert resumed.meta["first_step"] == last + 1
    steps_equal(resumed, full, first=last + 1)


def test_a_torn_checkpoint_is_never_loaded(tmp_path):
    """A save interrupted before the rename leaves `<step>.partial` (here: a truncated copy of a
    complete one, at a later step): it is ignored and the last complete step is loaded."""
    cfg = CFG.replace(strategy="ddp", devices=1)
    folder = str(tmp_path / "ck")
    torch_run.run(cfg.replace(steps=3, checkpoint_dir=folder, checkpoint_every=3))
    ckpt_folder.begin_step(folder, "torch", 5)  # as a save does before its first file
    torn = os.path.join(folder, "5" + checkpoint.PARTIAL)
    shutil.copytree(os.path.join(folder, "3"), torn)
    for name in os.listdir(torn):
        with open(os.path.join(torn, name), "r+b") as f:
            f.truncate(os.path.getsize(os.path.join(torn, name)) // 2)
    resumed = torch_run.run(cfg.replace(checkpoint_dir=folder, resume=True), record=True)
    assert resumed.meta["first_step"] == 4
    steps_equal(resumed, torch_run.run(cfg, record=True))


def test_a_save_replaces_a_linked_partial_and_refuses_a_linked_step(tmp_path):
    """A link planted at `<step>.partial` after the folder was checked is unlinked, never written through
    (before: DCP, the record and the manifest went into what it pointed to, then the link was renamed into
    place as the step); a link at `<step>` itself is not ours, never replaced."""
    import torch

    from jaxdp.core.errors import ConfigError
    from jaxdp.core.files import manifest
    from tests.jaxdp.core.files.test_nofollow import outside, snapshot

    folder = str(tmp_path / "ck")
    mine, before = outside(str(tmp_path))
    model = torch.nn.Linear(3, 2)
    state = checkpoint.ModelOptimizer(model, torch.optim.SGD(model.parameters(), lr=0.1))
    ckpt_folder.claim(folder, "torch", resume=False, overwrite=False).release()
    os.symlink(mine, os.path.join(folder, "4" + checkpoint.PARTIAL))
    checkpoint.save(folder, 4, state, CFG)
    assert snapshot(mine) == before and not os.path.islink(os.path.join(folder, "4"))
    assert manifest.problem(os.path.join(folder, "4")) is None and checkpoint.step_dirs(folder) == [4]
    os.symlink(mine, os.path.join(folder, "5"))
    with pytest.raises(ConfigError, match="5 was not written by this program"):
        checkpoint.save(folder, 5, state, CFG)
    assert snapshot(mine) == before and os.path.islink(os.path.join(folder, "5"))


def test_checkpoint_of_another_config_names_the_mismatch(four):
    folder = four["ddp"][2]
    with pytest.raises(
        checkpoint.CheckpointError, match=r"another configuration: hidden: checkpoint \[16, 16\], run \[8, 8\]"
    ):
        torch_run.run(CFG.replace(strategy="ddp", hidden=(8, 8), checkpoint_dir=folder, resume=True))
    with pytest.raises(checkpoint.CheckpointError, match="optimizer: checkpoint 'adamw', run 'sgd'"):
        torch_run.run(CFG.replace(strategy="ddp", optimizer="sgd", checkpoint_dir=folder, resume=True))
    with pytest.raises(checkpoint.CheckpointError, match="at step 3; --steps 3 leaves nothing to run"):
        torch_run.run(CFG.replace(strategy="ddp", steps=3, checkpoint_dir=folder, resume=True))
    # zero2's flat shards are not the per-parameter state that ddp loads
    with pytest.raises(
        checkpoint.CheckpointError, match="saved by 'zero2'.*holds different arrays than strategy 'ddp'"
    ):
        torch_run.run(CFG.replace(strategy="ddp", devices=1, checkpoint_dir=four["zero2"][2], resume=True))


def test_missing_and_corrupt_checkpoints(four, tmp_path):
    with pytest.raises(checkpoint.CheckpointError, match="no checkpoint directory"):
        torch_run.run(CFG.replace(checkpoint_dir=str(tmp_path / "nothing"), resume=True))
    ckpt_folder.begin_step(str(tmp_path / "empty"), "torch", 3)
    os.makedirs(tmp_path / "empty" / ("3" + checkpoint.PARTIAL))  # only a torn save
    with pytest.raises(checkpoint.CheckpointError, match="no complete checkpoint"):
        torch_run.run(CFG.replace(checkpoint_dir=str(tmp_path / "empty"), resume=True))
    cfg = CFG.replace(strategy="ddp", devices=1)
    for victim in (".distcp", ".metadata", checkpoint.RECORD):
        folder = str(tmp_path / f"corrupt{victim}")
        shutil.copytree(four["ddp"][2], folder)
        for name in os.listdir(os.path.join(folder, "3")):
            if name.endswith(victim):
                with open(os.path.join(folder, "3", name), "wb") as f:
                    f.write(b"garbage")
        with pytest.raises(checkpoint.CheckpointError, match="checkpoint step 3 in .* is damaged: .*" + victim):
            torch_run.run(cfg.replace(checkpoint_dir=folder, resume=True))


def test_cli_reports_checkpoint_errors_in_one_line(tmp_path, capsys):
    from jaxdp.harness.torch_cli import main

    code = main(
        [
            "train",
            "--strategy",
            "ddp",
            "--devices",
            "1",
            "--steps",
            "2",
            "--batch-size",
            "8",
            "--hidden",
            "4",
            "--checkpoint-dir",
            str(tmp_path / "none"),
            "--resume",
        ]
    )
    assert code == 2
    assert "torch_ref: error: --resume: no checkpoint directory" in capsys.readouterr().err
