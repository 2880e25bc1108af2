"""A checkpoint's manifest: every file of a step folder with its size and SHA-256, written last and
atomically (a temporary file, fsync, rename) into the folder, by both frameworks. `--resume` verifies
the manifest before anything of the step is read: a changed, missing, added or truncated file, or no
manifest at all (a save cut short, or one written before manifests), makes the step damaged, and the
refusal names the file and the newest step that is intact. A link in the step (or the step a link, or a
FIFO or a device in it) is never followed: never hashed, never written through, and the step is damaged.

What it proves: that the step's files are the bytes the run wrote (integrity against damage: a flipped
bit, a truncated or lost file, a half-copied folder). It is not proof of origin: anyone who can write
the folder can change a file and write a new manifest for it, and `--resume` takes that step, unless
the user gives a key (`manifest_key.py`: a MAC on the manifest, checked on `--resume` when the key is set).

- `write(step_dir, framework, step)`: after the save is complete (jaxdp: after orbax's rename;
  torch_ref: inside `<step>.partial`, before its rename).
- `problem(step_dir)`: None when intact, else what is wrong, naming the file.
- `verify(directory, steps, step)`: raise `DamagedCheckpoint` when `step` is damaged.
"""
from __future__ import annotations

import hashlib
import json
import os

from . import manifest_key, nofollow
from .atomic import writing
from .record import DamagedCheckpoint

NAME = "jaxdp-manifest.json"
FORMAT = 1
CHUNK = 1 << 20


def sha256(path) -> str:
    h = hashlib.sha256()
    with nofollow.open_plain(path) as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            h.update(block)
    return h.hexdigest()


def files(step_dir) -> list[str]:
    """Every entry under `step_dir` that is not a folder (relative, '/'-separated, sorted), the manifest
    excepted: files, and links (to folders too: `os.walk` lists them, never enters them), so that `strange`
    meets them."""
    out = []
    for root, folders, names in os.walk(step_dir):
        for name in names + [d for d in folders if not nofollow.is_folder(os.path.join(root, d))]:
            rel = os.path.relpath(os.path.join(root, name), step_dir).replace(os.sep, "/")
            if rel != NAME:
                out.append(rel)
    return sorted(out)


def write(step_dir, framework: str, step: int) -> None:
    """Write `step_dir`'s manifest, whole or not at all, and make it durable; a step that is a link or holds
    one is refused (DamagedCheckpoint): a manifest vouches for the step's own files only."""
    wrong = strange(step_dir)
    if wrong is not None:
        raise DamagedCheckpoint(f"checkpoint step {step} in {os.path.dirname(os.path.abspath(step_dir))!r}: "
                                f"{wrong}; no manifest is written for it")
    paths = {rel: os.path.join(step_dir, rel) for rel in files(step_dir)}
    entries = {rel: {"size": os.path.getsize(p), "sha256": sha256(p)} for rel, p in paths.items()}
    body = manifest_key.sign({"format": FORMAT, "written_by": "jaxdp", "framework": framework, "step": step,
                              "files": entries})
    with writing(os.path.join(step_dir, NAME), "w") as f:
        json.dump(body, f, indent=1)
        f.flush()
        os.fsync(f.fileno())


def strange(step_dir) -> str | None:
    """None when `step_dir` is a folder holding only files and folders; otherwise which entry is not."""
    if (what := nofollow.kind(step_dir)) is not None:
        return f"its folder is {what}"
    if (what := nofollow.kind(os.path.join(step_dir, NAME))) is not None:
        return f"its {NAME} is {what}"
    for rel in files(step_dir):
        if (what := nofollow.kind(os.path.join(step_dir, rel))) is not None:
            return f"{rel} is {what}, never followed"
    return None


def problem(step_dir) -> str | None:
    """None when every file of `step_dir` is as its manifest says; otherwise the first thing wrong."""
    path = os.path.join(step_dir, NAME)
    if (wrong := strange(step_dir)) is not None:
        return wrong
    if not os.path.isfile(path):
        return f"it has no {NAME} (a save cut short, or written before checkpoints carried manifests)"
    try:
        with nofollow.open_plain(path, "r") as f:
            body = json.load(f)
        expected = {str(rel): (int(e["size"]), str(e["sha256"])) for rel, e in body["files"].items()}
        unsigned = manifest_key.problem(body, os.path.basename(os.path.normpath(step_dir)))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        return f"its {NAME} is unreadable ({type(e).__name__})"
    if unsigned is not None:
        return unsigned
    present = files(step_dir)
    for rel in present:
        if rel not in expected:
            return f"{rel} is not in its manifest (added after the save)"
    for rel, (size, digest) in expected.items():
        full = os.path.join(step_dir, rel)
        if rel not in present:  # nor is a name outside the step ('../x', '/x') ever opened
            return f"{rel} is missing"
        if os.path.getsize(full) != size:
            return f"{rel} has {os.path.getsize(full)} bytes, its manifest says {size}"
        if sha256(full) != digest:
            return f"{rel} differs from its manifest (sha256)"
    return None


def verify(directory, steps: list[int], step: int) -> None:
    """Raise DamagedCheckpoint when checkpoint `step` of `directory` is not intact, naming the damaged
    file and the newest intact step among the earlier `steps` (the fix: delete the damaged folders)."""
    wrong = problem(os.path.join(directory, str(step)))
    if wrong is None:
        return
    intact = next((s for s in sorted(steps, reverse=True) if s < step
                   and problem(os.path.join(directory, str(s))) is None), None)
    fix = (f"the newest intact step is {intact}: delete folder {step} (and any later) to resume from it"
           if intact is not None else "no earlier step is intact: start without --resume")
    raise DamagedCheckpoint(f"checkpoint step {step} in {directory!r} is damaged: {wrong}; {fix}")
