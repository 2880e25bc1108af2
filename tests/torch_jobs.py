"""Which jobs the shared torch worlds (tests/torch_helpers.py `world(n)`) run: those the selected tests
need, so that `pytest -k zero2` trains zero2's configurations and nothing else.

A test that reads a world declares what it reads with the marker `torch_jobs`, whose arguments are needs:
a RunConfig (its training run, in the world of `cfg.devices` ranks), a pair `(job, n)` (one of the
world's other jobs: "comm", "buckets", "ring", "api", ...), the name of one of the test's parameters
(its value is a need: `@pytest.mark.torch_jobs("cfg")`), or a function of the test's parameters
(a dict) returning needs. After collection (-k, -m and --deselect applied) `select` records the
selected tests' needs; a world runs exactly those. While a test runs, reading a result it did not
declare fails with a line naming the marker, so a missing declaration fails in the full run too, not
only in a -k run that happens to leave the job out.
"""
from __future__ import annotations

from collections.abc import Iterable

import pytest

MARKER = "torch_jobs"
NEEDED: set | None = None  # every selected test's needs; None: everything (no pytest selection was made)
CURRENT: set | None = None  # the running test's needs; None: no test is running (no check)


def needs_of(item) -> set:
    """The needs an item declares (its `torch_jobs` markers), its parameters resolved."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    out: set = set()
    for mark in item.iter_markers(MARKER):
        for need in mark.args:
            out.update(_resolve(need, params))
    return out


def _resolve(need, params: dict) -> Iterable:
    if callable(need):
        return set(need(params))
    if isinstance(need, str):
        return {params[need]}
    return {need}


def select(items) -> None:
    """Record the needs of the tests that will run (call after deselection)."""
    global NEEDED
    NEEDED = set().union(*(needs_of(item) for item in items))


@pytest.hookimpl(trylast=True)  # after -k, -m and --deselect have removed what will not run
def pytest_collection_modifyitems(items):
    select(items)


def wanted(need) -> bool:
    return NEEDED is None or need in NEEDED


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    """The running test's needs (see `Results`)."""
    global CURRENT
    CURRENT = needs_of(item)
    try:
        yield
    finally:
        CURRENT = None


class Results(dict):
    """A world's results: {RunConfig or job name: result}; reading one checks the running test declared it."""

    def __init__(self, n: int, results: dict):
        super().__init__(results)
        self.n = n

    def __getitem__(self, key):
        need = key if not isinstance(key, str) else ("api" if key == "api_trace" else key, self.n)
        if CURRENT is not None and need not in CURRENT:
            raise LookupError(f"the test reads the torch world's {need!r} without declaring it: add it to its "
                              f"@pytest.mark.{MARKER}(...) (tests/torch_jobs.py)")
        if key not in self:
            raise LookupError(f"the torch world of {self.n} ran no {need!r}: not wanted by the selected tests")
        return super().__getitem__(key)
