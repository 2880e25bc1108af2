"""A trace is untrusted input (users write traces, and a file can be crafted): before `tracefile.load` reads
any array, this module reads what the file claims from its headers alone and refuses, in one line naming the
file and the size, a trace that would need more memory than the budget, a zip bomb, or a malformed file:

- the zip's end record (entries) and central directory (each member's declared and compressed size);
- each `.npy` member's header (shape and dtype, `numpy.lib.format`), never its data;
- the `meta` entry (small), whose step counts must be whole numbers the file can hold.

The budget is `JAXDP_TRACE_MEMORY` (bytes, or with a K/M/G/T suffix: `JAXDP_TRACE_MEMORY=16G`), default 4 GiB:
the arrays' bytes, plus ENTRY_BYTES per zip entry for the reader's own bookkeeping. Reading never needs more
than the headers declare: numpy reads exactly the header's count, and zipfile stops at the declared size.
"""
from __future__ import annotations

import json
import math
import os
import zipfile

import numpy as np

from ..errors import ConfigError

BUDGET_ENV = "JAXDP_TRACE_MEMORY"
DEFAULT_BUDGET = 4 << 30
ENTRY_BYTES = 2048  # a zip entry's ZipInfo, its name and the array's dict slot, generously
META_BYTES = 16 << 20  # the meta is a JSON configuration: kilobytes
BOMB_RATIO, BOMB_FLOOR = 100, 64 << 20  # declared / stored bytes above which a large file is a zip bomb
SUFFIXES = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def budget() -> int:
    """The memory budget in bytes: `JAXDP_TRACE_MEMORY`, or 4 GiB."""
    text = os.environ.get(BUDGET_ENV, "").strip().upper().removesuffix("B").removesuffix("I")
    if not text:
        return DEFAULT_BUDGET
    try:
        value = float(text[:-1] if text[-1:] in SUFFIXES else text) * SUFFIXES.get(text[-1:], 1)
    except (ValueError, KeyError):
        value = -1.0
    if not (math.isfinite(value) and value > 0):
        raise ConfigError(f"{BUDGET_ENV}={os.environ[BUDGET_ENV]!r}: give bytes, e.g. {BUDGET_ENV}=16G")
    return int(value)


def gib(n: int) -> str:
    return f"{n / (1 << 30):.3g} GiB" if n >= 1 << 30 else f"{n / (1 << 20):.3g} MiB"


class Refused(Exception):
    """What the headers show is not a trace that may be loaded; the message says what (no file name)."""


def check(f, limit: int) -> dict:
    """Everything about the trace open in `f` (a binary file, seekable: `regular.open_regular`) that is known
    before loading it: its meta (a dict), checked; raises Refused."""
    end = zipfile._EndRecData(f)  # the end record: 22 bytes (+ comment), no central directory yet
    if end is None:
        raise zipfile.BadZipFile("no zip end record (an .npz trace is a zip archive)")  # corrupt or truncated
    entries = int(end[zipfile._ECD_ENTRIES_TOTAL])
    if entries * ENTRY_BYTES > limit:
        raise Refused(f"{entries} entries would need {gib(entries * ENTRY_BYTES)} to index, over the budget of "
                      f"{gib(limit)}")
    f.seek(0)
    with zipfile.ZipFile(f) as z:  # leaves `f` open: the caller reads the arrays from it
        infos = z.infolist()
        _check_sizes(infos, os.fstat(f.fileno()).st_size, limit)
        meta = _meta(z)
        arrays = sum(_array_bytes(z, info) for info in infos)
    if arrays + entries * ENTRY_BYTES > limit:
        raise Refused(f"its arrays hold {gib(arrays)}, over the memory budget of {gib(limit)}")
    _check_steps(meta, entries)
    return meta


def _check_sizes(infos, on_disk: int, limit: int) -> None:
    declared = sum(i.file_size for i in infos)
    if declared > limit:
        raise Refused(f"its entries unpack to {gib(declared)}, over the memory budget of {gib(limit)}")
    if declared > BOMB_FLOOR and declared > BOMB_RATIO * max(on_disk, 1):
        raise Refused(f"a zip bomb: {gib(on_disk)} on disk unpacks to {gib(declared)} "
                      f"({declared / max(on_disk, 1):.0f}x; a trace compresses far less)")
    for info in infos:
        if not info.filename.endswith(".npy"):
            raise Refused(f"entry {info.filename[:80]!r} is not a .npy array")


def _header(f, name: str):
    """(shape, dtype) from the open member's .npy header, reading no data."""
    try:
        version = np.lib.format.read_magic(f)
        read = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
        if version not in read:
            raise ValueError(f"npy version {version}")
        shape, _, dtype = read[version](f, max_header_size=10_000)
    except (ValueError, EOFError, OSError, zipfile.BadZipFile) as e:
        raise Refused(f"entry {name!r} has no valid .npy header ({e})") from None
    if dtype.hasobject:
        raise Refused(f"entry {name!r} holds Python objects (a trace holds numbers and strings)")
    return shape, dtype


def _array_bytes(z: zipfile.ZipFile, info: zipfile.ZipInfo) -> int:
    with z.open(info) as f:
        shape, dtype = _header(f, info.filename)
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes > info.file_size:
        raise Refused(f"entry {info.filename!r} claims shape {shape} {dtype} ({gib(nbytes)}) in "
                      f"{info.file_size} bytes")
    return nbytes


def _meta(z: zipfile.ZipFile):
    """The meta dict; None when the file has no meta (tracefile says so)."""
    try:
        info = z.getinfo("meta.npy")
    except KeyError:
        return None
    if info.file_size > META_BYTES:
        raise Refused(f"its meta entry is {gib(info.file_size)} (a configuration is kilobytes)")
    with z.open(info) as f:
        shape, dtype = _header(f, "meta")
    try:
        with z.open(info) as f:
            value = np.lib.format.read_array(f, allow_pickle=False) if dtype.kind == "U" and shape == () else None
        meta = json.loads(str(value)) if value is not None else None
    except (ValueError, EOFError, OSError, zipfile.BadZipFile) as e:
        raise Refused(f"its meta is not valid JSON ({type(e).__name__}: {e})") from None
    if not isinstance(meta, dict):
        raise Refused("its meta is not a JSON object in a 0-d string array")
    return meta


def _check_steps(meta, entries: int) -> None:
    """meta `steps` / `first_step`: whole numbers, first_step - 1 <= steps, and no more steps than the file
    has entries (each step holds at least its loss)."""
    if meta is None:
        return
    values = {k: meta[k] for k in ("steps", "first_step") if k in meta}
    for key, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise Refused(f"meta {key} is {str(value)[:40]}: not a whole number of steps")
    steps, first = values.get("steps"), values.get("first_step", 1)
    if steps is not None and steps - first + 1 > entries:
        raise Refused(f"meta claims {steps - first + 1} steps, but the file has {entries} entries "
                      f"(each step holds at least its loss)")
    if steps is not None and first > steps + 1:
        raise Refused(f"meta first_step {first} is past steps {steps}")
