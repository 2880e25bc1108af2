"""A target program compiled once: `inspect --target`'s reading of a step compiled for GPUs, kept on disk.

Compiling Llama 3 8B for H100s takes a minute or more on a small machine; what the projection needs of the
program (inspect's dictionary and the kernels by kind, `kernels.read`) is a few hundred kilobytes. So the
reading is stored under a key of everything the compiled program depends on: the run configuration, the target
and its XLA configuration, XLA_FLAGS (XLA's debug options: its scheduler, its combiners), the nodes, jax's and
jaxlib's versions, the jaxdp source that builds or reads the program (`source_digest`: any change to it makes a
new key) and the reader that made the entry, and read back instead of compiling again; the projection is
recomputed from it (`calibration`), so a new calibration needs no compile.

The folder: $JAXDP_PROJECTION_CACHE, else $XDG_CACHE_HOME/jaxdp/projection (~/.cache/jaxdp/projection). It is
used only when it is a real folder (not a symbolic link) owned by the user; entries are opened without following
links (O_NOFOLLOW) and written whole (`core.atomic`). Where the folder cannot be used, every call compiles, and
`cache` says why.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import stat

from ..core.files import atomic
from ..core.run import targets

FORMAT = 1
ENV = "JAXDP_PROJECTION_CACHE"


def folder() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.environ.get(ENV) or os.path.join(base, "jaxdp", "projection")


def usable(path: str) -> str | None:
    """None if `path` can hold the cache (made 0700 where missing), else why not."""
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        st = os.lstat(path)
    except OSError as e:
        return f"{path}: {e.strerror}"
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        return f"{path} is not a folder (a link is not followed)"
    if st.st_uid != os.getuid():
        return f"{path} is not owned by this user"
    return None


# what neither compiles the program nor reads it: the projection made from the reading, the reports, this file
NOT_IN_PROGRAM = ("harness", os.path.join("analysis", "calibration.py"), os.path.join("analysis", "network.py"),
                  os.path.join("analysis", "calibration_points.py"), os.path.join("analysis", "program_cache.py"),
                  os.path.join("analysis", "target_memory.py"))


@functools.cache
def source_digest() -> str:
    """A digest of the jaxdp source that builds the program or reads it (all of it but NOT_IN_PROGRAM): a
    program compiled or read by other code is another entry."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    h = hashlib.sha256()
    for d, dirs, files in sorted(os.walk(root)):
        dirs.sort()
        for name in sorted(f for f in files if f.endswith(".py")):
            rel = os.path.relpath(os.path.join(d, name), root)
            if not rel.startswith(NOT_IN_PROGRAM):
                with open(os.path.join(d, name), "rb") as f:
                    h.update(rel.encode() + f.read())
    return h.hexdigest()


# run settings the compiled step does not depend on (how long to train, where to save, which host platform)
NOT_IN_KEY = ("steps", "platform", "checkpoint_dir", "checkpoint_every", "resume", "overwrite_checkpoints")


def key(cfg, target: str, nodes: int, reader: str = "") -> str:
    import jax
    import jaxlib

    run = {k: v for k, v in cfg.to_dict().items() if k not in NOT_IN_KEY}
    fields = {"format": FORMAT, "cfg": run, "target": target, "nodes": nodes,
              "target_config": targets.config_text(target), "jax": jax.__version__, "jaxlib": jaxlib.__version__,
              "source": source_digest(), "reader": reader,  # the reading stored: another reader, another entry
              "xla_flags": os.environ.get("XLA_FLAGS", "")}
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:32]


def load(path: str) -> dict | None:
    """The entry at `path`, or None (absent, a link, unreadable, another format)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    try:
        with os.fdopen(fd, "r", encoding="utf-8") as f:
            entry = json.load(f)
    except (OSError, ValueError):
        return None
    return entry if isinstance(entry, dict) and entry.get("format") == FORMAT else None


def compiled(cfg, target: str, nodes: int, read) -> tuple[dict, list, dict]:
    """(inspect's target dictionary without its projection, the kernels, cache facts) for `cfg` on `target`:
    from the cache, or compiled (`aot.TargetStep`, `gpu_program.describe` over `read(cfg, step)`) and stored."""
    where = folder()
    why = usable(where)
    path = os.path.join(where, key(cfg, target, nodes, read.__qualname__) + ".json") if why is None else None
    entry = load(path) if path else None
    if entry is not None:
        return entry["inspect"], entry["kernels"], {"hit": True, "path": path}
    from . import aot, gpu_program

    step = aot.TargetStep(cfg, target, nodes)
    out = gpu_program.describe(read(cfg, step), step)
    entry = {"format": FORMAT, "inspect": out, "kernels": step.kernels}
    if path:
        atomic.write_json(path, entry)
    return out, step.kernels, {"hit": False, "path": path, **({"unused": why} if why else {})}
