"""A checkpoint's record, the part both frameworks share: which configuration fields must match to
resume (`RECORD_FIELDS`), the one error (`CheckpointError`) and the check (`check_resumable`). The arrays
are each framework's own (orbax in jaxdp/checkpoint.py, torch.distributed.checkpoint in torch_ref). A damaged
checkpoint (`DamagedCheckpoint`: corrupt, hostile or non-finite) is a failed file, exit 3; the folder's
rules (marker, lock, torn saves) are in ckpt_folder.py, the file checksums in manifest.py."""
from __future__ import annotations

import numpy as np

from ..errors import RunFailed
from ..run.config import COMPARABLE_FIELDS, RunConfig

TORN = (".partial", ".orbax-checkpoint-tmp")  # a save in progress: torch_ref's suffix, orbax's (in the name)
RECORD_FIELDS = tuple(f for f in COMPARABLE_FIELDS if f != "steps")


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used; the message says why and what to do."""


class DamagedCheckpoint(CheckpointError, RunFailed):
    """A checkpoint file that failed: damaged, unreadable, hostile, or holding non-finite values (exit 3)."""


def corrupt(step: int, directory, cause: BaseException) -> DamagedCheckpoint:
    """The one line for an unreadable checkpoint: the cause's first line (at most 160 characters; the
    libraries' messages run to a thousand) and the fix."""
    text = str(cause).strip()
    first = text.splitlines()[0] if text else ""
    first = first if len(first) <= 160 else first[:157] + "..."
    return DamagedCheckpoint(f"checkpoint step {step} in {directory!r} is corrupt ({type(cause).__name__}: {first}); "
                           f"delete its folder to resume from the step before, or start without --resume")


def check_resumable(saved_config: dict, step: int, cfg, directory) -> None:
    """Refuse a checkpoint of another configuration (naming every field that differs) or one that
    leaves no step to run. Shared by jaxdp and torch_ref."""
    ours = cfg.to_dict()
    saved_config = {**RunConfig().to_dict(), **saved_config}  # a field added since it was saved: its default
    diffs = [f"{k}: checkpoint {saved_config.get(k)!r}, run {ours.get(k)!r}" for k in RECORD_FIELDS
             if saved_config.get(k) != ours.get(k)]
    if diffs:
        raise CheckpointError(f"checkpoint in {directory!r} is from another configuration: " + "; ".join(diffs))
    if step >= cfg.steps:
        raise CheckpointError(
            f"checkpoint in {directory!r} is at step {step}; --steps {cfg.steps} leaves nothing to run"
        )


def refuse_nonfinite(step: int, directory, arrays) -> None:
    """Raise DamagedCheckpoint naming the first array of `arrays` ((name, array) pairs, the arrays as
    this process holds them) with a NaN or an Inf: a poisoned state is never resumed."""
    for name, a in arrays:
        a = np.asarray(a)
        if a.dtype.kind not in "fc" and "float" in a.dtype.name:  # bfloat16 (ml_dtypes)
            a = a.astype(np.float32)
        if a.dtype.kind in "fc" and not np.isfinite(a).all():
            bad = int(a.size - np.isfinite(a).sum())
            raise DamagedCheckpoint(f"checkpoint step {step} in {directory!r} holds non-finite values: {name} "
                                    f"({bad} of {a.size} NaN or Inf); resume from an earlier step or start over")
