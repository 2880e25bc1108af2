"""`jaxdp.divergence.compare(a, b)`, the path the docs give users for where two runs part (docs/LIBRARY.md,
docs/TRACE.md): the first divergence and every finding, re-exported from `jaxdp.judge.divergence`."""
from __future__ import annotations

from .judge.divergence import Divergence, Report, compare

__all__ = ["Divergence", "Report", "compare"]
