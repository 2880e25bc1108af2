"""atomic.py: a file written whole gets the mode a plain open() would give it, not mkstemp's 0600."""
from __future__ import annotations

import os
import stat

import pytest

from jaxdp.core.files import atomic


@pytest.mark.parametrize("mask", [0o022, 0o077, 0o002])
def test_a_written_file_has_the_mode_the_umask_gives(tmp_path, mask):
    """A trace or `--json` written for a colleague is readable as `open(path, "w")` would leave it (was
    0600 whatever the umask); a staged report's files too."""
    old = os.umask(mask)
    try:
        atomic.write_bytes(tmp_path / "t.npz", b"x")
        atomic.write_json(tmp_path / "m.json", {"a": 1})
        with open(tmp_path / "plain", "w"):
            pass
        with atomic.staged(tmp_path / "rep") as stage:
            atomic.write_text(os.path.join(stage, "bench.md"), "y")
    finally:
        os.umask(old)
    want = 0o666 & ~mask
    assert stat.S_IMODE(os.stat(tmp_path / "plain").st_mode) == want
    for name in ("t.npz", "m.json", "rep/bench.md"):
        assert stat.S_IMODE(os.stat(tmp_path / name).st_mode) == want, name
