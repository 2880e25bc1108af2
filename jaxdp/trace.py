"""`jaxdp.trace`, the path the docs give users (docs/TRACE.md, docs/LIBRARY.md): the trace file
(`save`, `load`, `Trace`), its `Recorder` for any training loop, and `diff`, re-exported from
`jaxdp.core.traces.trace`, where they live (NumPy only, shared with torch_ref)."""
from __future__ import annotations

from .core.traces.trace import (
                         FIELDS,
                         FieldErrors,
                         Recorder,
                         Trace,
                         TraceDamaged,
                         TraceDiff,
                         TraceError,
                         TraceKey,
                         check_writable,
                         diff,
                         load,
                         parse_key,
                         save,
)

__all__ = ["FIELDS", "FieldErrors", "Recorder", "Trace", "TraceDamaged", "TraceDiff", "TraceError", "TraceKey",
           "check_writable", "diff", "load", "parse_key", "save"]
