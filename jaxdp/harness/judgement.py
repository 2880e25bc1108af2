"""What `divergence.compare` hands to the verdict, the `--json` document and the `--html` page, as typed
values: `Divergence` (one tensor beyond its bound), `Cell` (one (step, field, tensor) judged), `Bounds`
(what it was judged by) and `Report` (all of it). The `--json` document is made from them at its edge
(`verdict.as_json`), its keys those of docs/TRACE.md."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..core.records import ByName
from ..core.trace import TraceDiff
from .parity import Row


def ratio(error: float, bound: float | None) -> float:
    """How far `error` is beyond `bound` (> 1: beyond); inf for NaN, a missing bound, or anything above 0 or inf."""
    if bound is None or math.isnan(error):
        return math.inf
    if bound == 0 or math.isinf(bound):
        return math.inf if error > bound else 0.0
    return error / bound


@dataclass
class Divergence:
    """One tensor beyond its bound at one step (`missing`: the side that lacks the key)."""
    step: int
    field: str
    name: str
    key: str
    measure: str
    error: float
    bound: float | None
    index: tuple | None = None
    a: float | None = None
    b: float | None = None
    missing: str | None = None
    detail: str = ""
    allowance: str = ""  # the error model's allowance at the element, when it has one (jaxdp.harness.error_model)

    @property
    def ratio(self) -> float:
        return ratio(self.error, self.bound)

    def describe(self) -> str:
        where = f"step {self.step}, {self.field}, {self.name}"
        if self.missing:
            return f"{where}: {self.key} is missing in {self.missing.upper()}"
        if self.detail:
            return f"{where}: {self.detail}"
        at = f" at {list(self.index)}: A {self.a!r}, B {self.b!r}" if self.index is not None else ""
        allowance = f"; beyond its roundoff allowance: {self.allowance}" if self.allowance else ""
        if self.bound == 0:  # an exact check (the initial parameters, the batches): never 'identical' beside its error
            return f"{where}{at} (differs by {self.error:.2e} where it must be bitwise equal{allowance})"
        return f"{where}{at} ({self.measure} error {self.error:.2e}, bound {self.bound:g}{allowance})"


@dataclass(frozen=True)
class Cell(ByName):
    """One (step, field, tensor) judged: its measure beyond its bound by the largest factor (`--json`'s `table`)."""
    step: int
    field: str
    name: str
    measure: str
    error: float
    bound: float | None
    ratio: float


@dataclass(frozen=True)
class Bounds:
    """What a comparison was judged by: the bound per measure (the parity bounds: loss, grad, param, update,
    step update, elementwise; or `relative` under --tolerance), the dtype whose row they are (None under
    --tolerance) and where they came from, in words. `to_json()`: `--json`'s `bounds`."""
    measures: dict[str, float]
    source: str
    dtype: str | None = None

    def to_json(self) -> dict:
        return {**self.measures, **({} if self.dtype is None else {"dtype": self.dtype}), "source": self.source}

    def __getitem__(self, name: str):
        """`bounds["grad"]`, `bounds["source"]`: `to_json()`'s entries, for code written when this was a dict."""
        return self.to_json()[name]


@dataclass
class Report:
    """The comparison of A against B: `ok`, the first divergence, every (step, field, tensor) cell; the numbers
    it was judged on (`diff`, and `row`: the judge's, None under --tolerance) and the rank spread's findings."""
    ok: bool
    first: Divergence | None
    divergences: list[Divergence]
    cells: list[Cell]
    failures: list[str]
    notes: list[str]
    bounds: Bounds
    text: str = ""
    first_step: int = 1
    steps: int = 0
    relaxed: list = field(default_factory=list)  # one line per tensor the error model kept within its bound
    diff: TraceDiff | None = None
    row: Row | None = None
    tolerance: float | None = None
    spread: list = field(default_factory=list)
    precision: dict | None = None  # both traces' precision censuses and the dtype judged at (harness/precision.py)
