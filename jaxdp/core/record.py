"""A checkpoint's record, the part both frameworks share: which configuration fields must match to
resume (`RECORD_FIELDS`), the one error (`CheckpointError`) and the check (`check_resumable`). The arrays
are each framework's own (orbax in jaxdp/checkpoint.py, torch.distributed.checkpoint in torch_ref). A save
cut short by Ctrl-C is removed (`discard_torn`); the complete checkpoints stay."""
from __future__ import annotations

import os
import shutil

from .config import COMPARABLE_FIELDS, RunConfig

TORN = (".partial", ".orbax-checkpoint-tmp")  # a save in progress: torch_ref's suffix, orbax's (in the name)
RECORD_FIELDS = tuple(f for f in COMPARABLE_FIELDS if f != "steps")


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used; the message says why and what to do."""


def corrupt(step: int, directory, cause: BaseException) -> CheckpointError:
    """The one line for an unreadable checkpoint: the cause's first line (at most 160 characters; the
    libraries' messages run to a thousand) and the fix."""
    text = str(cause).strip()
    first = text.splitlines()[0] if text else ""
    first = first if len(first) <= 160 else first[:157] + "..."
    return CheckpointError(f"checkpoint step {step} in {directory!r} is corrupt ({type(cause).__name__}: {first}); "
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


def discard_torn(directory) -> None:
    """Remove the saves in `directory` that a stopped run left unfinished (both frameworks' temporary
    folders: never a checkpoint, and each framework's restore ignores them)."""
    if not directory or not os.path.isdir(directory):
        return
    for name in os.listdir(directory):
        if any(mark in name for mark in TORN):
            shutil.rmtree(os.path.join(directory, name), ignore_errors=True)
