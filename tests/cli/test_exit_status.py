"""The exit-status contract of both CLIs (jaxdp/core/errors.py): 0 success or agreement, 1 a MISMATCH verdict,
2 bad input, 3 a run or file that failed (a malformed trace, a full disk, non-finite state); each refusal one line
on stderr, never a traceback; the table in every `-h`."""
from __future__ import annotations

import contextlib
import errno
import os

import numpy as np
import pytest

from jaxdp.core import errors
from jaxdp.core.files import atomic
from jaxdp.core.traces import trace
from jaxdp.harness import cli, torch_cli
from tests.conftest import BASE, run

TINY = ["--strategy", "single", "--devices", "1", "--steps", "2", "--hidden", "8,8", "--batch-size", "8",
        "--dtype", "float32"]
MAINS = {"jaxdp": cli.main, "torch_ref": torch_cli.main}


def status_of(main, argv, capsys) -> tuple[int, str]:
    """(exit status, stderr) of `main(argv)`, stderr checked to be one line without a traceback for 2 and 3 (a
    MISMATCH, 1, is the verdict on stdout)."""
    try:
        code = main(argv)
    except SystemExit as e:  # argparse
        code = e.code
    err = capsys.readouterr().err
    if code >= 2:
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return code, err


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    folder = tmp_path_factory.mktemp("traces")
    a = run(BASE.replace(strategy="single", devices=1))
    trace.save(folder / "a.npz", a.meta, a.arrays)
    wrong = dict(a.arrays, **{"step/3/param/layers/0/kernel": a.arrays["step/3/param/layers/0/kernel"] * 1.01})
    trace.save(folder / "wrong.npz", a.meta, wrong)
    (folder / "bad.npz").write_bytes(b"PK\x03\x04 not a zip" * 10)
    return folder


@pytest.mark.parametrize("name,status", [("a", 0), ("wrong", 1), ("bad", 3)])
def test_diff_answers_agreement_mismatch_and_a_damaged_file(traces, capsys, name, status):
    code, err = status_of(cli.main, ["diff", str(traces / f"{name}.npz"), str(traces / "a.npz")], capsys)
    assert code == status
    if status == 3:
        assert "jaxdp: error: trace" in err and "bad.npz" in err and "corrupt" in err


@pytest.mark.parametrize("prog", list(MAINS))
def test_bad_flag_is_2_and_every_help_has_the_table(prog, capsys):
    assert status_of(MAINS[prog], ["train", "--steps", "many"], capsys)[0] == 2
    with pytest.raises(SystemExit):
        MAINS[prog](["train", "-h"])
    out = " ".join(capsys.readouterr().out.split())
    assert "exit status: 0 success or the runs agree; 1 a MISMATCH verdict; 2 bad input" in out
    assert "3 a run or file that failed" in out


@pytest.mark.parametrize("prog", list(MAINS))
def test_a_full_disk_is_3_in_one_line(prog, tmp_path, monkeypatch, capsys):
    """ENOSPC while the trace is written (simulated: the atomic writer's open fails as a full disk does)."""
    path = tmp_path / "t.npz"

    @contextlib.contextmanager
    def full_disk(p, mode="wb"):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), os.fspath(p))
        yield

    monkeypatch.setattr(atomic, "writing", full_disk)
    code, err = status_of(MAINS[prog], ["train", *TINY, "--trace", str(path)], capsys)
    assert code == 3 and err == f"{prog}: error: {path}: No space left on device\n"
    assert not path.exists()


@pytest.mark.parametrize("prog", list(MAINS))
def test_success_is_0(prog, tmp_path, capsys):
    assert status_of(MAINS[prog], ["train", *TINY, "--trace", str(tmp_path / "t.npz")], capsys)[0] == 0
    assert np.isfinite(trace.load(tmp_path / "t.npz").losses()).all()


def test_the_mapping():
    assert errors.exit_status(errors.ConfigError("x")) == 2
    assert errors.exit_status(trace.TraceError("x")) == 2  # traces that cannot be compared: the arguments
    assert errors.exit_status(trace.TraceDamaged("x")) == 3
    assert errors.exit_status(OSError(errno.EIO, "I/O error")) == 3


def test_a_device_as_the_trace_is_refused_before_training(capsys):
    """`--trace /dev/full` (a device): the atomic rename would have replaced the device node (as root it did)."""
    code, err = status_of(cli.main, ["train", *TINY, "--trace", "/dev/full"], capsys)
    assert code == 2 and "not a regular file" in err
