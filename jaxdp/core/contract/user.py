"""The user's FUNCTION of `jaxdp check FILE.py:FUNCTION`: its file (or module) imported, the function found, one
line naming the fix otherwise. Shared by the JAX check (this process) and the torch check (each rank imports the
file anew: a function of a file loaded by path does not pickle to another process)."""
from __future__ import annotations

import importlib
import importlib.util
import os

from ..errors import ConfigError, RunFailed
from ..files import paths


def split(step: str, returns: str) -> tuple[str, str]:
    """(FILE.py or module, FUNCTION) of `step`; `returns` says what FUNCTION gives, for the line of a bad one."""
    where, _, name = step.rpartition(":")
    if not where or not name.isidentifier():
        raise ConfigError(f"check {step!r}: give FILE.py:FUNCTION ({returns}), e.g. jaxdp check my_train.py:make_step")
    if where.endswith(".py"):
        paths.input_file(where, "FILE.py")
    return where, name


def load(where: str, name: str):
    """FUNCTION `name` of the file or module `where`: RunFailed if importing it fails, ConfigError if it has none."""
    try:
        if where.endswith(".py"):
            spec = importlib.util.spec_from_file_location(os.path.basename(where)[:-3], where)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        else:
            module = importlib.import_module(where)
    except Exception as e:
        raise RunFailed(f"{where}: importing it failed: {type(e).__name__}: {e}") from e
    fn = getattr(module, name, None)
    if not callable(fn):
        raise ConfigError(f"{where} has no function {name!r}; give FILE.py:FUNCTION naming a function in it")
    return fn
