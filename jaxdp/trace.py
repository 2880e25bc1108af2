"""The trace: a run's every loss, batch, gradient and parameter, as a NumPy `.npz` (a public contract,
documented in docs/TRACE.md). Both frameworks write it; users may write it from their own code.

Keys:
  meta                    0-d string array holding JSON (the run configuration, framework, versions)
  init/<name>             every parameter before step 1
  step/<k>/loss           mean loss over step k's global batch (k = 1..steps)
  step/<k>/x, step/<k>/y  step k's whole global batch
  step/<k>/grad/<name>    the full averaged gradient the update used (before clipping)
  step/<k>/param/<name>   every parameter after step k's update
<name> is the Flax path joined with '/', in Flax layout (a kernel is [in, out]), unsharded.
"""
from __future__ import annotations

import json
import os
import tempfile
import zipfile
from dataclasses import dataclass

import numpy as np

from .config import COMPARABLE_FIELDS

FIELDS = ("loss", "grad", "param", "init", "x", "y")


class TraceError(ValueError):
    """A trace that cannot be read or compared; the message says why."""


@dataclass
class Trace:
    meta: dict
    arrays: dict[str, np.ndarray]

    @property
    def steps(self) -> int:
        return int(self.meta["steps"])

    @property
    def first_step(self) -> int:
        """1, or the step after the checkpoint a resumed run started from."""
        return int(self.meta.get("first_step", 1))

    def names(self) -> list[str]:
        return sorted(k[len("init/"):] for k in self.arrays if k.startswith("init/"))

    def losses(self) -> np.ndarray:
        return np.array([float(self.arrays[f"step/{k}/loss"]) for k in range(self.first_step, self.steps + 1)])


def check_writable(path, flag: str = "--trace") -> None:
    """Fail now, in one line, if a file cannot be written at `path` later (checked before training,
    so a long run never dies at its end): creates the folder as `save` would, and a probe file in it."""
    folder = os.path.dirname(os.path.abspath(os.fspath(path)))
    try:
        os.makedirs(folder, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, suffix=".probe"):
            pass
    except OSError as e:
        raise TraceError(f"cannot write {flag} {os.fspath(path)!r}: {e.strerror}: {e.filename!r}; "
                         f"choose a writable path") from None


def save(path, meta: dict, arrays: dict[str, np.ndarray]) -> None:
    """Write atomically: a reader never sees a half-written trace."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, suffix=".npz.tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, meta=np.array(json.dumps(meta, sort_keys=True)), **arrays)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def load(path) -> Trace:
    path = os.fspath(path)
    if not os.path.exists(path):
        raise TraceError(f"trace {path!r} does not exist")
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except (zipfile.BadZipFile, ValueError, OSError, EOFError) as e:
        raise TraceError(
            f"trace {path!r} is corrupt or truncated ({type(e).__name__}: {e}); re-run to write it again"
        ) from None
    if "meta" not in arrays:
        raise TraceError(f"trace {path!r} has no 'meta' entry: not a jaxdp trace")
    try:
        meta = json.loads(str(arrays.pop("meta")))
    except json.JSONDecodeError as e:
        raise TraceError(f"trace {path!r}: 'meta' is not valid JSON ({e})") from None
    trace = Trace(meta, arrays)
    missing = [f"step/{k}/loss" for k in range(trace.first_step, trace.steps + 1) if f"step/{k}/loss" not in arrays]
    if missing:
        raise TraceError(f"trace {path!r} is incomplete: missing {missing[0]} (and {len(missing) - 1} more)")
    return trace


def check_comparable(a: Trace, b: Trace) -> None:
    """Two traces are comparable when they ran the same configuration (strategy, devices and
    framework may differ). Otherwise raise, naming every field that differs."""
    diffs = [
        f"{k}: {a.meta.get(k)!r} vs {b.meta.get(k)!r}" for k in COMPARABLE_FIELDS if a.meta.get(k) != b.meta.get(k)
    ]
    if diffs:
        raise TraceError("traces ran different configurations: " + "; ".join(diffs))


def relative_error(a, b) -> float:
    """Worst element of |a - b| relative to the largest magnitude of b (the reference)."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        raise TraceError(f"shape mismatch {a.shape} vs {b.shape}")
    scale = np.max(np.abs(b)) if b.size else 0.0
    err = np.max(np.abs(a - b)) if b.size else 0.0
    return float(err / scale) if scale > 0 else float(err)


def _field(key: str) -> str:
    parts = key.split("/")
    return parts[0] if parts[0] == "init" else parts[2]


def diff(a: Trace, b: Trace, check_config: bool = True) -> dict:
    """Worst relative error per field of `a` against reference `b`:
    {'worst': {field: err}, 'per_array': {key: err}}. Arrays present in only one trace are an error."""
    if check_config:
        check_comparable(a, b)
    only = sorted(set(a.arrays) ^ set(b.arrays))
    if only:
        raise TraceError(f"traces hold different arrays, e.g. {only[:3]} ({len(only)} in all)")
    per_array = {k: relative_error(a.arrays[k], b.arrays[k]) for k in sorted(a.arrays)}
    worst = {f: 0.0 for f in FIELDS}
    for key, err in per_array.items():
        worst[_field(key)] = max(worst[_field(key)], err)
    return {"worst": worst, "per_array": per_array}


def format_diff(result: dict, tolerance: float | None = None) -> str:
    lines = [f"{'field':<6}  worst relative error"]
    for field, err in result["worst"].items():
        flag = "" if tolerance is None else ("  ok" if err <= tolerance else "  MISMATCH")
        lines.append(f"{field:<6}  {err:.3e}{flag}")
    return "\n".join(lines)
