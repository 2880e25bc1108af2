"""The suite's one rerun rule (pyproject.toml: `reruns`, `only_rerun`): a test whose torch rank was killed by
SIGSEGV or SIGBUS (a native crash in torch or gloo, not in our code), or whose world's ranks could not connect
(gloo's connectFullMesh), runs once more; every other failure, a
wrong value or a rank's Python error included, fails the first time. Run on the repository's own settings."""
from __future__ import annotations

import os
import subprocess
import sys

from tests import REPO

CASES = '''
import pathlib

class RankError(RuntimeError):  # the message torch_ref.launch gives a rank a signal killed
    pass

def _first(name):
    mark = pathlib.Path(__file__).with_name(name)
    first = not mark.exists()
    mark.touch()
    return first

def test_a_crash_once_is_run_again():
    if _first("crash"):
        raise RankError("rank 1 failed: killed by signal 11 (SIGSEGV); then rank 2: RuntimeError: Connection reset")

def test_a_world_that_could_not_connect_once_is_run_again():
    if _first("mesh"):
        raise RankError("rank 0 failed: RuntimeError: Gloo connectFullMesh failed with [pair.cc:553] Connection closed")

def test_a_crash_every_time_fails():
    raise RankError("rank 0 failed: killed by signal 7 (SIGBUS)")

def test_a_wrong_value_once_fails():
    assert not _first("value"), "loss 0.31 != 0.30"

def test_a_rank_error_of_python_once_fails():
    if _first("python"):
        raise RankError("rank 1 failed: ValueError: bad shape")

def test_a_kill_once_fails():
    if _first("kill"):
        raise RankError("rank 1 failed: killed by signal 9 (SIGKILL)")
'''


def test_only_a_native_crash_or_an_unconnected_world_is_run_again(tmp_path):
    (tmp_path / "test_cases.py").write_text(CASES)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-c", os.path.join(REPO, "pyproject.toml"), "--rootdir",
                           str(tmp_path), "-n", "0", "-p", "no:cacheprovider", "-q", str(tmp_path)],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    last = proc.stdout.strip().splitlines()[-1]
    assert "4 failed, 2 passed, 3 rerun" in last, proc.stdout[-3000:]
    assert "FAILED test_cases.py::test_a_crash_every_time_fails" in proc.stdout
