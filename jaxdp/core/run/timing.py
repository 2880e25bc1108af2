"""Step-time statistics, one definition for every report (`compare`, `bench`) and both frameworks.

The first step (JAX: tracing + compilation + the step; torch: eager, its first allocations) and
`WARMUP_STEPS` more are excluded; the median and the quartiles of the rest are what is read.
"""
from __future__ import annotations

import math

import numpy as np

WARMUP_STEPS = 1  # excluded after the first (compiling) step


def timing(step_times) -> dict:
    """First step, warm-up steps, then the median and quartiles of the rest (the last step alone when
    a run is too short to have a rest)."""
    times = [float(t) for t in step_times]
    timed = np.asarray(times[1 + WARMUP_STEPS:] or times[-1:], dtype=float)
    return {"first_step_s": times[0] if times else math.nan, "warmup_s": times[1:1 + WARMUP_STEPS],
            "median_step_s": float(np.median(timed)), "p25_step_s": float(np.percentile(timed, 25)),
            "p75_step_s": float(np.percentile(timed, 75)), "timed_steps": int(timed.size)}
