"""Checkpoints with torch.distributed.checkpoint (DCP), the torch twin of `jaxdp/checkpoint.py`.

Layout of `--checkpoint-dir DIR`:
    DIR/<step>/            one complete checkpoint: DCP's `.metadata` and `__<rank>_0.distcp` files,
                           plus `record.json` (step, config, strategy, world size, RNG state)
    DIR/<step>.partial/    a save in progress (or torn by a crash): never read, replaced by the next save

- What is saved: each strategy's `checkpoint` object, a DCP `Stateful`. For most strategies it is
  `ModelOptimizer`: `get_state_dict(model, optimizer)` keyed by torch parameter name, so DDP's
  replicated tensors are written once (DCP de-duplicates them), FSDP2's DTensors shard by shard,
  and ZeroRedundancyOptimizer's state by the rank that owns each parameter. `zero2` keeps its
  optimizer state as shards of one flat vector and saves them as 1-D DTensors of the unpadded length
  (see `strategies/zero/zero2.py`). DCP reshards on load, so a checkpoint resumes at another world size.
- Atomic: every rank writes into `<step>.partial`; after DCP's save returns (its last phase is a
  collective, so every rank's files are written), rank 0 adds `record.json` and renames the
  directory to `<step>`, then a barrier. A directory named by a step is therefore always complete;
  one killed mid-save stays `.partial` and is ignored.
- Data position and randomness: batches are a pure function of (seed, step) and training draws no
  random numbers; the step is in the record, and so is `torch.get_rng_state()` (restored on resume).
- Resume checks the saved configuration (`RECORD_FIELDS`, the same fields as jaxdp's) and refuses a
  missing directory, a directory without a complete checkpoint, a corrupt one, and one whose arrays
  are not the ones this strategy and optimizer hold, each with a clear message.
"""
from __future__ import annotations

import base64
import json
import os
import warnings

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)

from jaxdp.core.errors import ConfigError
from jaxdp.core.files import ckpt_folder, disk_full, manifest, nofollow
from jaxdp.core.files import record as rules
from jaxdp.core.files.atomic import writing
from jaxdp.core.files.record import RECORD_FIELDS, CheckpointError, DamagedCheckpoint  # noqa: F401 (one contract)
from jaxdp.core.process import progress

from .safe_dcp import SafePlanner, SafeReader

RECORD = "record.json"
PARTIAL = ".partial"
KEEP = 3  # complete checkpoints kept (as orbax's max_to_keep in jaxdp)
# DCP's notice on every save and load of one process (`no_dist`, chosen here): not the user's business
SINGLE_PROCESS = "torch.distributed is disabled, unavailable or uninitialized"
OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)  # one key per parameter: reshardable


class ModelOptimizer:
    """DCP Stateful of a model and its torch optimizer (None where this rank has none, as dp's
    workers), keyed by parameter name: {'model': {name: tensor}, 'optim': {'state.<name>.exp_avg': ...}}."""

    def __init__(self, model, optimizer=None):
        self.model, self.optimizer = model, optimizer

    def state_dict(self) -> dict:
        if self.optimizer is None:
            return {"model": get_model_state_dict(self.model, options=OPTIONS)}
        materialise(self.optimizer)  # a fresh optimizer has no state yet: give DCP tensors to load into
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer, options=OPTIONS)
        return {"model": model_sd, "optim": optim_sd}

    def load_state_dict(self, sd: dict) -> None:
        if self.optimizer is None:
            set_model_state_dict(self.model, sd["model"], options=OPTIONS)
        else:
            set_state_dict(self.model, self.optimizer, model_state_dict=sd["model"], optim_state_dict=sd["optim"],
                           options=OPTIONS)


@torch.no_grad()
def materialise(optimizer) -> None:
    """Create `optimizer`'s state tensors by one step on zero gradients with lr 0 (the parameters do
    not move: every update is multiplied by lr); the values are overwritten by the load."""
    params = [p for g in optimizer.param_groups for p in g["params"]]
    if optimizer.state or any(p.grad is not None for p in params):
        return
    for p in params:
        p.grad = torch.zeros_like(p)
    lrs = [g["lr"] for g in optimizer.param_groups]
    for g in optimizer.param_groups:
        g["lr"] = 0.0
    optimizer.step()
    for g, lr in zip(optimizer.param_groups, lrs, strict=False):
        g["lr"] = lr
    optimizer.zero_grad(set_to_none=True)


def flat_keys(sd, prefix: str = "") -> list[str]:
    """DCP's names for the leaves of a nested dict: the path joined by dots."""
    keys = []
    for k, v in sd.items():
        if isinstance(v, dict):
            keys += flat_keys(v, f"{prefix}{k}.")
        else:
            keys.append(f"{prefix}{k}")
    return keys


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def _barrier() -> None:
    if _distributed():
        dist.barrier()


def step_dirs(directory) -> list[int]:
    """The checkpoints in `directory` by step: the folders its marker lists (a `.partial` one is not one,
    nor a folder this program did not write)."""
    return ckpt_folder.steps(directory)


# ---- save ---------------------------------------------------------------------------------------
def maybe_save(directory, step: int, state, cfg, force: bool = False) -> bool:
    """Save step `step` when it is due (every --checkpoint-every steps) or `force` (a run stopped by a signal),
    as jaxdp's `Checkpointer.maybe_save`; every rank calls it."""
    if cfg.checkpoint_every <= 0 or not (force or step % cfg.checkpoint_every == 0):
        return False
    save(directory, step, state, cfg)
    progress.kept(directory, f"checkpoint step {step} in {directory}")
    return True


def save(directory, step: int, state, cfg) -> str:
    """Save `state` (a strategy's `checkpoint`) as step `step`; every rank calls it. Returns the path."""
    rank = dist.get_rank() if _distributed() else 0
    final = os.path.join(directory, str(step))
    partial = final + PARTIAL
    if rank == 0:
        if os.path.lexists(final) and step not in step_dirs(directory):  # a link to a folder is not ours
            raise ConfigError(f"--checkpoint-dir {directory}: {final} was not written by this program; "
                              f"it is never overwritten: move it, or give another --checkpoint-dir")
        ckpt_folder.begin_step(directory, "torch", step)  # listed before its first file: a torn save is ours
        nofollow.remove(partial)  # a save torn by an earlier crash (a link there: unlinked, never written through)
        os.mkdir(partial)  # made here, by this run: DCP writes into a folder, never through a link
    _barrier()
    then = (lambda: ckpt_folder.drop_unfinished(directory, step)) if rank == 0 else None  # the .partial goes
    with disk_full.answered(f"checkpoint step {step} not saved", partial, then):  # one line, exit 3
        _save_files(directory, step, state, cfg, rank, partial, final)
    _barrier()  # nobody goes on before the step's directory exists
    return final


def _save_files(directory, step: int, state, cfg, rank: int, partial, final) -> None:
    """DCP's files of every rank into `partial`; on rank 0 the record and the manifest, then the rename."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=SINGLE_PROCESS, category=UserWarning)
        dcp.save({"train": state}, checkpoint_id=partial, no_dist=not _distributed())
    if rank == 0:
        record = {"step": step, "framework": "torch", "config": cfg.to_dict(), "strategy": cfg.strategy,
                  "devices": dist.get_world_size() if _distributed() else 1,
                  "rng_state": base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode(),
                  "data_position": "batches are a pure function of (seed, step); the next step is step + 1"}
        _write_json(os.path.join(partial, RECORD), record)
        manifest.write(partial, "torch", step)  # last, and inside: the rename makes it whole with the rest
        nofollow.remove(final)  # a checkpoint of ours at this step (listed by the marker): replaced
        os.rename(partial, final)
        _fsync_dir(directory)
        ckpt_folder.prune(directory, KEEP)


def _write_json(path, obj) -> None:
    with writing(path, "w") as f:  # a temporary file renamed onto `path`: a link there is replaced, not followed
        json.dump(obj, f)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def local_arrays(sd, prefix: str = ""):
    """(name, this rank's values as a NumPy array) for every floating tensor of a nested state dict."""
    for k, v in sd.items():
        if isinstance(v, dict):
            yield from local_arrays(v, f"{prefix}{k}.")
        elif isinstance(v, torch.Tensor) and v.is_floating_point():
            local = v.to_local() if hasattr(v, "to_local") else v
            local = local.detach().cpu()
            yield f"{prefix}{k}", (local.float() if local.dtype == torch.bfloat16 else local).numpy()


# ---- resume -------------------------------------------------------------------------------------
def find(directory, cfg) -> tuple[int, str, dict]:
    """(step, path, record) of the latest complete checkpoint in `directory`, checked against `cfg`."""
    if not os.path.isdir(directory):
        raise CheckpointError(f"--resume: no checkpoint directory {directory!r}; run once with --checkpoint-dir "
                              f"{directory} --checkpoint-every K first")
    steps = step_dirs(directory)
    if not steps:
        raise CheckpointError(f"--resume: no complete checkpoint in {directory!r}")
    step = steps[-1]
    path = os.path.join(directory, str(step))
    manifest.verify(directory, steps, step)  # before any byte of it is read
    try:
        with nofollow.open_plain(os.path.join(path, RECORD), "r") as f:  # a file, never a FIFO or a link
            record = json.load(f)
        saved = record["config"]
        assert record["step"] == step, f"record says step {record['step']}"
    except Exception as e:  # noqa: BLE001 - missing, truncated, not JSON, wrong fields: all "corrupt"
        raise rules.corrupt(step, directory, e) from None
    rules.check_resumable(saved, step, cfg, directory)
    return step, path, record


def restore(directory, state, cfg) -> int:
    """Load the latest complete checkpoint of `directory` into `state` (a strategy's `checkpoint`);
    every rank calls it. Restores the RNG state; returns the checkpoint's step."""
    step, path, record = find(directory, cfg)
    try:
        saved = set(SafeReader(path).read_metadata().state_dict_metadata)
    except DamagedCheckpoint:
        raise
    except Exception as e:  # noqa: BLE001
        raise rules.corrupt(step, directory, e) from None
    missing = [k for k in flat_keys({"train": state.state_dict()}) if k not in saved]
    if missing:
        raise CheckpointError(
            f"checkpoint in {directory!r} (saved by {record.get('strategy')!r}) holds different arrays than "
            f"strategy {cfg.strategy!r} with optimizer {cfg.optimizer!r} expects; missing: {', '.join(missing[:3])}"
            + (f" and {len(missing) - 3} more" if len(missing) > 3 else ""))
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=SINGLE_PROCESS, category=UserWarning)
            dcp.load({"train": state}, storage_reader=SafeReader(path), planner=SafePlanner(),
                     no_dist=not _distributed())
    except (Exception, CheckpointException) as e:  # noqa: BLE001 - DCP's is a BaseException, one error per rank
        cause = next(iter(e.failures.values()), e) if isinstance(e, CheckpointException) else e
        if isinstance(cause, DamagedCheckpoint):
            raise cause from None
        raise rules.corrupt(step, directory, cause) from None
    rules.refuse_nonfinite(step, directory, local_arrays(state.state_dict()))
    rng = base64.b64decode(record["rng_state"])
    torch.set_rng_state(torch.frombuffer(bytearray(rng), dtype=torch.uint8))
    return step
