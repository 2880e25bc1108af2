"""A trace is untrusted input (jaxdp/core/traces/trace_limits.py): what it would cost is read from its headers, and a
trace over the memory budget, a zip bomb, a meta claiming absurd step counts or a malformed entry is refused
in one line naming the file, fast and in little memory; honest traces load as before."""
from __future__ import annotations

import io
import json
import time
import tracemalloc
import zipfile

import numpy as np
import pytest

from jaxdp.core.errors import ConfigError
from jaxdp.core.traces import trace, trace_limits


def npy(array) -> bytes:
    out = io.BytesIO()
    np.save(out, array, allow_pickle=True)
    return out.getvalue()


def write(path, entries: dict, meta=None, compress=zipfile.ZIP_STORED):
    """An .npz by hand: `entries` name -> .npy bytes (or a callable writing them), plus the meta."""
    with zipfile.ZipFile(path, "w", compress) as z:
        z.writestr("meta.npy", npy(np.array(json.dumps(meta if meta is not None else {"steps": 1}))))
        for name, content in entries.items():
            if callable(content):
                with z.open(name + ".npy", "w", force_zip64=True) as f:
                    content(f)
            else:
                z.writestr(name + ".npy", content)
    return path


def refused(path, match: str) -> float:
    """Load `path`, expecting TraceDamaged matching `match`; returns the peak Python/numpy memory (MiB)."""
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        with pytest.raises(trace.TraceDamaged, match=match) as caught:
            trace.load(path)
        peak = tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()
    assert str(path) in str(caught.value) and "\n" not in str(caught.value)
    assert time.perf_counter() - t0 < 5 and peak < 32, (time.perf_counter() - t0, peak)
    return peak


def test_a_meta_claiming_ten_million_steps(tmp_path):
    """Before: the 'incomplete' message listed 10^7 missing keys: 12 s and 870 MB."""
    path = tmp_path / "steps.npz"
    trace.save(path, {"steps": 10**7}, {"step/1/loss": np.float32(1.0)})
    refused(path, "meta claims 10000000 steps, but the file has 2 entries")


def test_a_zip_bomb(tmp_path):
    """128 MiB of zeros in 130 KB (ratio ~1000); a real bomb is just larger. Before: loaded whole."""
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f8", "fortran_order": False, "shape": (2**24,)})

    def zeros(f):
        f.write(header.getvalue())
        for _ in range(8):
            f.write(bytes(2**24))

    path = write(tmp_path / "bomb.npz", {"step/1/loss": zeros}, compress=zipfile.ZIP_DEFLATED)
    refused(path, r"a zip bomb: .* on disk unpacks to 128 MiB")


def test_over_the_memory_budget_and_how_to_raise_it(tmp_path, monkeypatch):
    path = tmp_path / "t.npz"
    trace.save(path, {"steps": 1}, {"step/1/loss": np.float32(1.0), "init/w": np.zeros((64, 1024))})
    monkeypatch.setenv(trace_limits.BUDGET_ENV, "256K")
    refused(path, r"its entries unpack to 0.5 MiB, over the memory budget of 0.25 MiB; raise the budget with "
                  r"JAXDP_TRACE_MEMORY")
    monkeypatch.setenv(trace_limits.BUDGET_ENV, "1M")
    assert trace.load(path).arrays["init/w"].shape == (64, 1024)
    monkeypatch.setenv(trace_limits.BUDGET_ENV, "lots")
    with pytest.raises(ConfigError, match="JAXDP_TRACE_MEMORY='lots': give bytes, e.g. JAXDP_TRACE_MEMORY=16G"):
        trace.load(path)


def test_a_header_that_claims_more_than_its_entry_holds(tmp_path):
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f8", "fortran_order": False, "shape": (10**9,)})
    path = write(tmp_path / "lies.npz", {"step/1/loss": header.getvalue() + bytes(64)})
    refused(path, r"entry 'step/1/loss.npy' claims shape \(1000000000,\) float64 \(7.45 GiB\) in \d+ bytes")


@pytest.mark.parametrize("entry,meta,match", [
    ({"step/1/loss": npy(np.array([{"x": 1}], dtype=object))}, None, "holds Python objects"),
    ({"step/1/loss": b"not an npy"}, None, "has no valid .npy header"),
    ({"step/1/loss": npy(np.float32(1))}, {"steps": "1e9"}, "meta steps is 1e9: not a whole number"),
    ({"step/1/loss": npy(np.float32(1))}, {"steps": 1, "first_step": 10**6}, "first_step 1000000 is past steps 1"),
    ({"notes.txt": b"hello"}, None, "entry 'notes.txt.npy'"),
])
def test_malformed_entries(tmp_path, entry, meta, match):
    refused(write(tmp_path / "m.npz", entry, meta), match)
