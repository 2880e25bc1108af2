"""The distance between two float arrays in units in the last place, counted in their own type
(float64, float32, or bfloat16 stored as such): what `jaxdp diff` reports next to its measures."""
from __future__ import annotations

import math

import numpy as np


def ulp_distance(a, b) -> float | None:
    """The largest distance in units in the last place between a_i and b_i, counted in the arrays'
    own float type (float64, float32, or bfloat16 stored as such); None for other types and for
    arrays of different types; inf when either is non-finite."""
    a, b = np.asarray(a), np.asarray(b)
    bits = ULP_BITS.get(a.dtype.name)
    if bits is None or a.dtype != b.dtype or a.shape != b.shape:
        return None
    if not (np.isfinite(a.astype(np.float64)).all() and np.isfinite(b.astype(np.float64)).all()):
        return math.inf
    if not a.size:
        return 0.0
    ia, ib = _ordered(a, bits), _ordered(b, bits)
    same_sign = (ia >= 0) == (ib >= 0)
    # Same sign: an exact integer difference; opposite signs: |ia| + |ib| may pass 2^63, so in floats.
    exact = np.where(same_sign, np.abs(ia - np.where(same_sign, ib, ia)), 0)
    across = np.where(same_sign, 0.0, np.abs(ia).astype(np.float64) + np.abs(ib).astype(np.float64))
    return float(max(exact.max(), across.max()))


ULP_BITS = {"float64": 64, "float32": 32, "bfloat16": 16}


def _ordered(x, bits: int) -> np.ndarray:
    """Float bits as int64 counting representable values in order (+0 and -0 both 0)."""
    raw = x.view({64: np.int64, 32: np.int32, 16: np.int16}[bits]).astype(np.int64)
    magnitude = raw & ((1 << (bits - 1)) - 1)
    return np.where(raw < 0, -magnitude, magnitude)
