"""A launched process's last words: the one line its error is answered with (and a crash's traceback), handed to
the launcher in a file instead of printed, so that a failed `jaxdp train --processes P` prints one line, the first
cause's, and not one line and a traceback per process (a full disk in one process makes its peers fail too: their
connections close).

- `leave(line, status, traceback)`: in a process the launcher started (`ENV` names the file), write them and
  return True; anywhere else, or when the file cannot be written (the launcher's folder on the full disk),
  return False: the caller prints them itself.
- `read(path)`: what a process left, or None (killed before it could say anything).
"""
from __future__ import annotations

import json
import os

from ..files import atomic

ENV = "JAXDP_LAST_WORDS"


def leave(line: str, status: int, traceback: str = "") -> bool:
    path = os.environ.get(ENV)
    if not path:
        return False
    try:  # whole or not at all: the launcher reads the file once it exists
        atomic.write_json(path, {"line": line, "status": status, "traceback": traceback})
    except OSError:
        return False
    return True


def read(path) -> dict | None:
    try:
        with open(path) as f:
            words = json.load(f)
        return {"line": str(words["line"]), "status": int(words["status"]), "traceback": str(words["traceback"])}
    except (OSError, ValueError, KeyError, TypeError):
        return None
