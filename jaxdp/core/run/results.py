"""What a run returns (`RunResult`) and how it stops on non-finite state (`NonFiniteLoss`): one class each for
both frameworks (torch_ref.train returns and raises these too)."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import RunFailed
from .config import RunConfig


class NonFiniteLoss(RunFailed, FloatingPointError):
    """The loss, a gradient or a parameter became NaN or Inf (exit 3); the message names the step and the
    tensor."""


@dataclass
class RunResult:
    """What a run returns, the same for both frameworks (torch_ref.train returns this class too)."""
    cfg: RunConfig
    losses: list[float] = field(default_factory=list)
    arrays: dict[str, np.ndarray] = field(default_factory=dict)  # the trace's arrays (when tracing)
    meta: dict = field(default_factory=dict)
    first_step_s: float = 0.0  # JAX: tracing + compilation + the step; torch: eager, first allocations
    steps_per_s: float | None = None  # over steps 2..N; None when no step ran after the first (nothing timed)
    step_times: list[float] = field(default_factory=list)  # wall seconds of each step, the first included

    def rate(self) -> str:
        """The summaries' 'X.X steps/s after' (the first step), or 'n/a' when no step ran after it."""
        if self.steps_per_s is None:
            return "steps/s after it n/a (no step after the first)"
        return f"{self.steps_per_s:.1f} steps/s after"
