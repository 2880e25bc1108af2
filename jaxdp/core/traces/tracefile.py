"""The trace file: a run's every loss, batch, gradient and parameter, as a NumPy `.npz` (a public
contract, documented in docs/TRACE.md): `Trace`, `save` (atomic) and `load` (checked). Both frameworks
write it; users may write it from their own code.

Keys:
  meta                    0-d string array holding JSON (the run configuration, framework, versions)
  init/<name>             every parameter before step 1
  step/<k>/loss           mean loss over step k's global batch (k = 1..steps)
  step/<k>/x, step/<k>/y  step k's whole global batch
  step/<k>/grad/<name>    the full averaged gradient the update used (before clipping)
  step/<k>/param/<name>   every parameter after step k's update
  state/<name>            optional: every non-trainable variable (e.g. running statistics) before step 1
  step/<k>/state/<name>   optional: every non-trainable variable after step k
  step/<k>/spread/<name>  optional: the largest difference across ranks after step k (jaxdp/core/traces/spread.py)
<name> is the Flax path joined with '/', in Flax layout (a kernel is [in, out]), unsharded.
"""
from __future__ import annotations

import json
import os
import zipfile
from dataclasses import dataclass

import numpy as np

from ..errors import RunFailed
from ..files import atomic, regular
from . import trace_limits
from .trace_keys import parse_key

FIELDS = ("loss", "grad", "param", "update", "init", "x", "y", "state")


class TraceError(ValueError):
    """A trace that cannot be read or compared; the message says why (exit 2: the paths or traces given)."""


class TraceDamaged(TraceError, RunFailed):
    """A trace file that is corrupt, truncated, malformed or hostile (exit 3); the message names the file."""


@dataclass
class Trace:
    meta: dict
    arrays: dict[str, np.ndarray]

    @property
    def steps(self) -> int:
        """meta `steps`, or (a user's trace without it) the last step with a loss."""
        return int(self.meta["steps"]) if "steps" in self.meta else max(self._loss_steps(), default=0)

    @property
    def first_step(self) -> int:
        """1, or the step after the checkpoint a resumed run started from (without meta `steps`: the
        first step with a loss)."""
        if "first_step" in self.meta or "steps" in self.meta:
            return int(self.meta.get("first_step", 1))
        return min(self._loss_steps(), default=1)

    def _loss_steps(self) -> list[int]:
        keys = (parse_key(k) for k in self.arrays)
        return [key.step for key in keys if key is not None and key.kind == "loss"]

    def names(self) -> list[str]:
        return sorted(key.name for k in self.arrays if (key := parse_key(k)) is not None and key.kind == "init")

    def losses(self) -> np.ndarray:
        return np.array([float(self.arrays[f"step/{k}/loss"]) for k in range(self.first_step, self.steps + 1)])


def check_writable(path, flag: str = "--trace") -> None:
    """Fail now, in one line, if a file cannot be written at `path` later (checked before training,
    so a long run never dies at its end); creates nothing (`paths.output_file`)."""
    from ..errors import ConfigError
    from ..files.paths import output_file

    try:
        output_file(path, flag)
    except ConfigError as e:
        raise TraceError(str(e)) from None


def save(path, meta: dict, arrays: dict[str, np.ndarray]) -> None:
    """Write atomically: a reader never sees a half-written trace (`atomic.writing`)."""
    with atomic.writing(path, "wb") as f:
        np.savez(f, meta=np.array(json.dumps(meta, sort_keys=True)), **arrays)


def load(path) -> Trace:
    """The trace at `path`, checked: what it would cost and its meta read from its headers first
    (`trace_limits`: a trace over the memory budget, a zip bomb or a malformed file is refused before any
    array is read), then its arrays. A damaged or hostile file raises TraceDamaged (exit 3)."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise TraceError(f"trace {path!r} does not exist")
    limit = trace_limits.budget()
    try:
        with regular.open_regular(path) as f:  # one open file, a regular one, for the headers and the arrays
            trace_limits.check(f, limit)
            f.seek(0)
            with np.load(f, allow_pickle=False) as z:
                arrays = {k: z[k] for k in z.files}
    except regular.NotRegular as e:
        raise TraceDamaged(f"trace {path!r} {e.strerror}; give a trace file (.npz)") from None
    except trace_limits.Refused as e:
        hint = f"; raise the budget with {trace_limits.BUDGET_ENV}, e.g. =16G" if "budget" in str(e) else ""
        raise TraceDamaged(f"trace {path!r} refused: {e}{hint}") from None
    except (zipfile.BadZipFile, ValueError, OSError, EOFError) as e:
        raise TraceDamaged(
            f"trace {path!r} is corrupt or truncated ({type(e).__name__}: {e}); re-run to write it again"
        ) from None
    if "meta" not in arrays:
        raise TraceDamaged(f"trace {path!r} has no 'meta' entry: not a jaxdp trace")
    try:
        meta = json.loads(str(arrays.pop("meta")))
    except json.JSONDecodeError as e:
        raise TraceDamaged(f"trace {path!r}: 'meta' is not valid JSON ({e})") from None
    trace = Trace(meta, arrays)
    missing = (f"step/{k}/loss" for k in range(trace.first_step, trace.steps + 1) if f"step/{k}/loss" not in arrays)
    first = next(missing, None)
    if first is not None:
        raise TraceDamaged(f"trace {path!r} is incomplete: missing {first} (and {sum(1 for _ in missing)} more)")
    return trace
