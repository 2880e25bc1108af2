"""Checkpoints with orbax: the train state saved as it lives on the devices (sharded arrays are
written shard by shard), next to a JSON record of the run.

- Atomic: orbax writes each step into a temporary directory and renames it when complete, and a
  temporary (torn) directory is never listed as a step, so a run killed in the middle of a save
  resumes from the last complete checkpoint.
- Data position and randomness: batches are a pure function of (seed, step) and training draws no
  other random numbers, so the step number and the seed (both in the record) are the whole of it.
- Resharding: a checkpoint saved by one strategy on N devices resumes under another layout (zero3
  on 4 devices -> zero3 on 2, ddp on 4 -> ddp on 1). When the layout differs, the saved arrays are
  read whole, converted to full ("canonical") arrays (ZeRO's zero padding cut off, pmap's per-device
  copies collapsed: `strategies.host_full`, read from each strategy's layout) and placed by the new
  strategy's `init(params, opt_state)`.
"""
from __future__ import annotations

import contextlib
import os

import jax
import numpy as np

from .core.files import ckpt_folder, disk_full, manifest
from .core.files import record as rules
from .core.files.record import RECORD_FIELDS, CheckpointError, DamagedCheckpoint  # noqa: F401 (re-exported)
from .strategies import host_full


def _key(path) -> str:
    return ".".join(str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))) for k in path)


def flatten(tree) -> dict:
    """{'params.layers.0.kernel': leaf, 'opt_state.1.0.mu.layers.0.kernel': leaf, ...}"""
    return {_key(path): leaf for path, leaf in jax.tree.flatten_with_path(tree)[0]}


def _manager(directory, every: int = 1, read_only: bool = False):
    import orbax.checkpoint as ocp
    from absl import logging as absl_logging

    # orbax narrates every save at WARNING, and logs a writer thread's error with its traceback at ERROR before
    # raising it from `wait_until_finished` (where it is answered: a full disk in one line, disk_full.py)
    absl_logging.set_verbosity(absl_logging.FATAL)
    options = ocp.CheckpointManagerOptions(
        max_to_keep=3, create=not read_only, enable_async_checkpointing=False, read_only=read_only
    )
    handlers = {"state": ocp.StandardCheckpointHandler(), "record": ocp.JsonCheckpointHandler()}
    return ocp.CheckpointManager(os.path.abspath(directory), options=options, item_handlers=handlers)


class Checkpointer:
    """Saves the train state every `every` steps into `directory`."""

    def __init__(self, directory, every: int, lock: ckpt_folder.Lock | None = None):
        self.directory, self.every, self.lock = directory, every, lock
        self.manager = _manager(directory, every)

    def maybe_save(self, step: int, state, cfg, force: bool = False) -> bool:
        """Save step `step` when it is due (every `every` steps) or `force` (a run stopped by a signal)."""
        if not force and (self.every <= 0 or step % self.every):
            return False
        import orbax.checkpoint as ocp

        record = {
            "step": step,
            "config": cfg.to_dict(),
            "strategy": cfg.strategy,
            "devices": cfg.devices,
            "data_position": "batches are a pure function of (seed, step); the next step is step + 1",
        }
        primary = jax.process_index() == 0
        folder = os.path.join(self.directory, str(step))
        then = (lambda: ckpt_folder.drop_unfinished(self.directory, step)) if primary else None
        with disk_full.answered(f"checkpoint step {step} not saved", folder, then):  # one line, exit 3
            if primary:  # listed before its first file: a save cut short is this run's too (ckpt_folder.py)
                ckpt_folder.begin_step(self.directory, "jax", step)
            self.manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(flatten(state)),
                                                            record=ocp.args.JsonSave(record)))
            self.manager.wait_until_finished()  # orbax's threads: their error is raised here
            if primary:  # orbax has renamed the step into place; the manifest comes last
                manifest.write(folder, "jax", step)
        return True

    def close(self):
        self.manager.close()
        self.release()

    def release(self) -> None:
        """End this run's hold on the folder (the lock taken by process 0)."""
        if self.lock is not None:
            self.lock.release()

    def stop(self) -> int | None:
        """Ctrl-C: let orbax finish what it started (its threads write on after `save` returns, and fail
        loudly at interpreter exit otherwise), close, and return the latest complete step (None: none)."""
        with contextlib.suppress(Exception):  # a save cut short in its first part: nothing to finish
            self.manager.wait_until_finished()
        step = self.manager.latest_step()
        with contextlib.suppress(Exception):
            self.manager.close()
        self.release()
        return step


def restore(directory, cfg, strategy, problem, optimizer):
    """(state, step) from the latest complete checkpoint in `directory`, placed for `strategy`."""
    import orbax.checkpoint as ocp

    if not os.path.isdir(directory):
        raise CheckpointError(
            f"--resume: no checkpoint directory {directory!r}; run once with --checkpoint-dir "
            f"{directory} --checkpoint-every K first"
        )
    steps = ckpt_folder.steps(directory)
    if not steps:
        raise CheckpointError(f"--resume: no complete checkpoint in {directory!r}")
    step = steps[-1]
    manifest.verify(directory, steps, step)  # before orbax reads any byte of it
    manager = _manager(directory, read_only=True)
    try:
        record = manager.restore(step, args=ocp.args.Composite(record=ocp.args.JsonRestore()))["record"]
    except Exception as e:  # noqa: BLE001 - orbax raises many kinds; all mean "unreadable"
        raise rules.corrupt(step, directory, e) from None
    rules.check_resumable(record["config"], step, cfg, directory)

    fresh = strategy.init(problem.params)  # the layout (shapes, shardings) this run wants
    target = flatten(fresh)
    treedef = jax.tree.structure(fresh)
    same_layout = record["strategy"] == cfg.strategy and record["devices"] == cfg.devices
    try:
        metadata = manager.item_metadata(step)["state"]
    except Exception as e:  # noqa: BLE001
        raise rules.corrupt(step, directory, e) from None
    if metadata is None or set(metadata) != set(target):
        raise CheckpointError(
            f"checkpoint in {directory!r} holds different arrays than strategy {cfg.strategy!r} "
            f"with optimizer {cfg.optimizer!r} expects"
        )
    if same_layout:
        abstract = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=v.sharding) for k, v in target.items()}
    else:  # read whole, on this process's first CPU device, then re-lay out
        local = jax.sharding.SingleDeviceSharding(jax.local_devices(backend="cpu")[0])
        abstract = {
            k: jax.ShapeDtypeStruct(tuple(metadata[k].shape), metadata[k].dtype, sharding=local) for k in target
        }
    try:
        arrays = manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract)))["state"]
    except Exception as e:  # noqa: BLE001
        raise rules.corrupt(step, directory, e) from None
    manager.close()
    rules.refuse_nonfinite(step, directory, local_arrays(arrays))
    if same_layout:
        return jax.tree.unflatten(treedef, [arrays[k] for k in target]), step

    canonical = flatten(jax.eval_shape(lambda p: (p, optimizer.init(p)), problem.params))
    full = {}
    for (_k, like), key in zip(canonical.items(), target, strict=False):  # batch_stats last: not zipped
        full[key] = host_full(record["strategy"], np.asarray(arrays[key]), like)  # as the saving strategy laid it
    params, opt_state = jax.tree.unflatten(
        jax.tree.structure((problem.params, fresh.opt_state)), [full[k] for k in target if k in full]
    )
    return _with_stats(strategy.init(params, opt_state), fresh, target, arrays), step


def local_arrays(arrays: dict):
    """(name, values) of each array's shards that this process holds (every process checks its own)."""
    for k, a in arrays.items():
        for shard in getattr(a, "addressable_shards", None) or [None]:
            yield k, np.asarray(a if shard is None else shard.data)


def _with_stats(state, fresh, target, arrays):
    """`state` with the saved running statistics (BatchNorm), placed as this run places them: they
    are replicated, so they carry over to any layout as they are (one copy of a ddp-pmap stack)."""
    if getattr(fresh, "batch_stats", None) is None:
        return state
    keys = [k for k in target if k.startswith("batch_stats.")]
    likes = jax.tree.leaves(fresh.batch_stats)
    leaves = []
    for key, like in zip(keys, likes, strict=True):
        a = np.asarray(arrays[key])
        leaves.append(jax.device_put(a if a.shape == like.shape else a[0], like.sharding))
    return state._replace(batch_stats=jax.tree.unflatten(jax.tree.structure(fresh.batch_stats), leaves))
