"""A checkpoint's manifest: every file of a step folder with its size and SHA-256, written last and
atomically (a temporary file, fsync, rename) into the folder, by both frameworks. `--resume` verifies
the manifest before anything of the step is read: a changed, missing, added or truncated file, or no
manifest at all (a save cut short, or one written before manifests), makes the step damaged, and the
refusal names the file and the newest step that is intact.

- `write(step_dir, framework, step)`: after the save is complete (jaxdp: after orbax's rename;
  torch_ref: inside `<step>.partial`, before its rename).
- `problem(step_dir)`: None when intact, else what is wrong, naming the file.
- `verify(directory, steps, step)`: raise `DamagedCheckpoint` when `step` is damaged.
"""
from __future__ import annotations

import hashlib
import json
import os

from .atomic import writing
from .record import DamagedCheckpoint

NAME = "jaxdp-manifest.json"
FORMAT = 1
CHUNK = 1 << 20


def sha256(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            h.update(block)
    return h.hexdigest()


def files(step_dir) -> list[str]:
    """Every file under `step_dir` (relative, '/'-separated, sorted), the manifest excepted."""
    out = []
    for root, _, names in os.walk(step_dir):
        for name in names:
            rel = os.path.relpath(os.path.join(root, name), step_dir).replace(os.sep, "/")
            if rel != NAME:
                out.append(rel)
    return sorted(out)


def write(step_dir, framework: str, step: int) -> None:
    """Write `step_dir`'s manifest, whole or not at all, and make it durable."""
    paths = {rel: os.path.join(step_dir, rel) for rel in files(step_dir)}
    entries = {rel: {"size": os.path.getsize(p), "sha256": sha256(p)} for rel, p in paths.items()}
    body = {"format": FORMAT, "written_by": "jaxdp", "framework": framework, "step": step, "files": entries}
    with writing(os.path.join(step_dir, NAME), "w") as f:
        json.dump(body, f, indent=1)
        f.flush()
        os.fsync(f.fileno())


def problem(step_dir) -> str | None:
    """None when every file of `step_dir` is as its manifest says; otherwise the first thing wrong."""
    path = os.path.join(step_dir, NAME)
    if not os.path.isfile(path):
        return f"it has no {NAME} (a save cut short, or written before checkpoints carried manifests)"
    try:
        with open(path) as f:
            entries = json.load(f)["files"]
        expected = {str(rel): (int(e["size"]), str(e["sha256"])) for rel, e in entries.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        return f"its {NAME} is unreadable ({type(e).__name__})"
    present = files(step_dir)
    for rel in present:
        if rel not in expected:
            return f"{rel} is not in its manifest (added after the save)"
    for rel, (size, digest) in expected.items():
        full = os.path.join(step_dir, rel)
        if not os.path.isfile(full):
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
