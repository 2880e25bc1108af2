"""Files that are whole or absent: every trace, report and JSON the commands write goes through here, so
that a run stopped at any moment (Ctrl-C, a kill) leaves no half-written file and no empty folder.

- `writing(path)`: a file object on a temporary file in the same folder, moved onto `path`
  (`os.replace`, atomic on one file system) when the block ends normally, removed when it raises; the
  file gets the mode a plain `open(path, "w")` would give (0666 less the umask), not mkstemp's 0600.
- `write_bytes` / `write_text` / `write_json`: the one-call forms; `write_json("-", ...)` writes to stdout
  (`--json -`), the command's own stdout while `json_on_stdout()` sends the rest of what it prints to stderr.
- `staged(out)`: a folder of files written together (a report, bench.json + bench.md): the files are
  written into a hidden folder inside `out` and moved into `out` only once all are written; when the
  block raises, nothing stays, not even `out` (or its parents) if they did not exist before.
- `probe(folder)`: can a file be written in `folder` later? Checked by writing one, and leaving no
  folder behind that was not there.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile

STDOUT = "-"  # `--json -`: the document on stdout
_json_out: list = []  # the stdout `json_on_stdout` kept for the document


def missing_dirs(folder) -> list[str]:
    """The folders `os.makedirs(folder)` would create, outermost first."""
    missing, d = [], os.path.abspath(os.fspath(folder))
    while not os.path.exists(d):
        missing.append(d)
        parent = os.path.dirname(d)
        if parent == d:
            break
        d = parent
    return missing[::-1]


def remove_dirs(made: list[str]) -> None:
    """Remove the folders in `made` (outermost first) that are still empty, innermost first."""
    for d in reversed(made):
        with contextlib.suppress(OSError):
            os.rmdir(d)


def _umask() -> int:
    """The process's umask (read from /proc, so that no thread ever sees it changed; else set and reset)."""
    with contextlib.suppress(OSError, ValueError), open("/proc/self/status") as f:
        for line in f:
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def writing(path, mode: str = "wb"):
    """`with writing(path) as f: ...`: `path` appears whole when the block ends, or not at all."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    made = missing_dirs(folder)
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp's 0600 would make the file unreadable to others
        with os.fdopen(fd, mode) as f:
            yield f
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        remove_dirs(made)
        if isinstance(e, OSError) and e.filename is None and e.strerror:  # a write's or close's: name the file
            raise type(e)(e.errno, e.strerror, path) from None
        raise


def write_bytes(path, data: bytes) -> None:
    with writing(path, "wb") as f:
        f.write(data)


def write_text(path, text: str) -> None:
    with writing(path, "w") as f:
        f.write(text)


def write_json(path, obj, **kwargs) -> None:
    if path == STDOUT:
        out = _json_out[-1] if _json_out else sys.stdout
        json.dump(obj, out, **kwargs)
        out.write("\n")
        out.flush()
        return
    with writing(path, "w") as f:
        json.dump(obj, f, **kwargs)


@contextlib.contextmanager
def json_on_stdout():
    """`--json -`: within the block stdout is the JSON document's alone (`write_json("-")`); the command's
    text (tables, verdicts, 'wrote ...') goes to stderr, so that `jaxdp diff a b --json - | jq` reads JSON."""
    _json_out.append(sys.stdout)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        _json_out.pop()


@contextlib.contextmanager
def staged(out):
    """`with staged(out) as stage: (write files into stage)`: on normal exit every file of `stage` is moved
    into `out`; on an exception `stage` is removed, and so is `out` when this call created it."""
    out = os.fspath(out)
    made = missing_dirs(out)
    os.makedirs(out, exist_ok=True)
    stage = tempfile.mkdtemp(dir=out, prefix=".partial-")
    try:
        yield stage
        for name in sorted(os.listdir(stage)):
            os.replace(os.path.join(stage, name), os.path.join(out, name))
    except BaseException as e:
        shutil.rmtree(stage, ignore_errors=True)
        remove_dirs(made)
        if isinstance(e, OSError) and e.filename is None and e.strerror:  # a write's or close's: name the folder
            raise type(e)(e.errno, e.strerror, out) from None
        raise
    os.rmdir(stage)


def probe(folder) -> None:
    """Raise OSError now if a file cannot be created in `folder` (made as a writer would make it), and
    leave behind no folder that did not exist."""
    made = missing_dirs(folder)
    try:
        os.makedirs(folder, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, suffix=".probe"):
            pass
    finally:
        remove_dirs(made)
