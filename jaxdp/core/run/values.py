"""What each number of a run may be: one table of ranges, read by `RunConfig.validate` (so the
library API is checked as the command line is), by the `--help` texts, and by the bad-input test.

A rule names the smallest value allowed and whether it is allowed itself; every float must be
finite (NaN and Inf are never a learning rate). `int_list` and `bool_text` parse the two flag
types argparse has no parser for. Numpy-free, framework-free: both packages read it.
"""
from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

from ..errors import ConfigError


@dataclass(frozen=True)
class Rule:
    """A number flag: its type, its lower bound (`low`, allowed when `inclusive`), and an example."""

    kind: type
    low: float
    inclusive: bool
    example: str
    high: float | None = None  # the largest value allowed (inclusive), when there is one

    def problem(self, value) -> str | None:
        """Why `value` breaks this rule, or None when it keeps it."""
        if self.kind is float and not math.isfinite(value):
            return f"must be a finite number {self.wants()}"
        below = value < self.low if self.inclusive else value <= self.low
        if below or (self.high is not None and value > self.high):
            return f"must be {self.wants()}"
        return None

    def wants(self) -> str:
        """The allowed range in words, e.g. '>= 1' or '> 0'."""
        low = f"{'>=' if self.inclusive else '>'} {_number(self.low)}"
        return low if self.high is None else f"{low} and <= {_number(self.high)}"


def _number(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


_COUNT = Rule(int, 1, True, "1")
RULES = {
    "devices": Rule(int, 1, True, "4"),
    "steps": Rule(int, 1, True, "20"),
    "batch_size": Rule(int, 1, True, "64"),
    "accum": Rule(int, 1, True, "1"),
    "lr": Rule(float, 0, False, "1e-3"),
    "weight_decay": Rule(float, 0, True, "0.01"),
    "clip_norm": Rule(float, 0, True, "1.0"),
    "seed": Rule(int, 0, True, "0", high=2**32 - 1),
    "bucket_mb": Rule(float, 0, False, "25"),
    "n_layer": _COUNT,
    "n_head": Rule(int, 1, True, "2"),
    "n_kv_head": Rule(int, 0, True, "0"),
    "d_model": Rule(int, 1, True, "32"),
    "d_ff": Rule(int, 0, True, "0"),
    "seq_len": Rule(int, 1, True, "32"),
    "replicas": _COUNT,
    "inner_steps": _COUNT,
    "outer_lr": Rule(float, 0, False, "0.7"),
    "outer_momentum": Rule(float, 0, True, "0.9", high=1),
    "shards": Rule(int, 0, True, "0"),
    "checkpoint_every": Rule(int, 0, True, "0"),
}


def check_ranges(values: dict) -> None:
    """Raise ConfigError for the first number outside its rule: `--flag VALUE: must be ...; e.g. ...`."""
    for name, rule in RULES.items():
        if name not in values:
            continue
        why = rule.problem(values[name])
        if why:
            flag = "--" + name.replace("_", "-")
            raise ConfigError(f"{flag} {values[name]}: {why}; e.g. {flag} {rule.example}")


def int_list(text: str) -> tuple[int, ...]:
    """'64,64' -> (64, 64): positive integers, comma separated, no empty entry."""
    parts = [p.strip() for p in str(text).split(",")]
    try:
        widths = tuple(int(p) for p in parts)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers such as 64,64, got {text!r}") from None
    if min(widths) <= 0:
        raise argparse.ArgumentTypeError(f"expected positive widths such as 64,64, got {text!r}")
    return widths


def bool_text(text: str) -> bool:
    """'true'/'1'/'yes' or 'false'/'0'/'no' (any case)."""
    if str(text).lower() in ("true", "1", "yes"):
        return True
    if str(text).lower() in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
