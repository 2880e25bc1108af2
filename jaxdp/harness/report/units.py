"""Numbers as the report prints them: bytes in KiB / MiB / GiB, rates and times with SI prefixes (989 TFLOP/s,
450 GB/s, 3 us), never a raw float such as 989000000000000.0."""
from __future__ import annotations

import math

BINARY = (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10))
SI = (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3), ("", 1.0), ("m", 1e-3), ("us", 1e-6),
      ("n", 1e-9))


def nbytes(b) -> str:
    """1536 -> '1.5 KiB'; None -> '-'."""
    if b is None or (isinstance(b, float) and math.isnan(b)):
        return "-"
    for name, size in BINARY:
        if abs(b) >= size:
            return f"{b / size:.3g} {name}"
    return f"{b:.0f} B"


def si(x: float, unit: str) -> str:
    """989e12, 'FLOP/s' -> '989 TFLOP/s'; 3e-6, 's' -> '3 us'; 0.4, '' -> '0.4'."""
    if x == 0 or not unit:
        return f"{x:.3g} {unit}".strip()
    for prefix, scale in SI:
        if abs(x) >= scale * 0.9995:
            if prefix == "us":
                return f"{x / scale:.3g} us" if unit == "s" else f"{x / scale:.3g} u{unit}"
            return f"{x / scale:.3g} {prefix}{unit}".strip()
    return f"{x:.3g} {unit}".strip()


def efficiency(x: float) -> str:
    """A projected efficiency as every part of the report prints it (one format, one number per fact): 0.283 ->
    '0.3'. One significant figure: it is modelled (an assumed MFU, the links model), never measured, and one figure
    is all the confidence it has (docs/GPU.md, "The range")."""
    return f"{x:.1g}"
