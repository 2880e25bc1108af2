"""What is read as a file is a regular file (jaxdp/core/files/regular.py, issue 67 item 4): a device, a FIFO or a socket
named where a file is read is refused in one line, exit 2, before a byte is read and within a second, by every
command (diff's traces, --resume's folder), and every reader refuses one swapped in after that check."""
from __future__ import annotations

import os
import socket
import stat
import time

import pytest

from jaxdp.core.errors import ConfigError
from jaxdp.core.files import ckpt_folder, manifest, paths, regular
from jaxdp.core.traces import trace
from jaxdp.harness import cli, torch_cli

DEVICES = ["/dev/zero", "/dev/urandom"]


@pytest.fixture
def odd(tmp_path):
    """{kind: path} of a FIFO, a socket (bound, listening: a reader would wait on it) and the devices."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    sock_path = str(tmp_path / "sock")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(sock_path)
    sock.listen()
    yield {"fifo": str(fifo), "socket": sock_path, **{d: d for d in DEVICES}}
    sock.close()


def test_kind_names_what_a_path_is(odd, tmp_path):
    assert regular.what(odd["fifo"]) == "a FIFO (named pipe)"
    assert regular.what(odd["socket"]) == "a socket"
    assert regular.what("/dev/zero") == "a character device"
    assert regular.what(tmp_path) == "a folder"
    (tmp_path / "f").write_text("x")
    assert regular.what(tmp_path / "f") is None


@pytest.mark.parametrize("name", ["fifo", "socket", *DEVICES])
def test_input_file_refuses_what_is_not_a_regular_file(odd, name):
    start = time.monotonic()
    with pytest.raises(ConfigError, match="is a .*, not a regular file") as caught:
        paths.input_file(odd[name], "trace A")
    assert time.monotonic() - start < 1.0 and odd[name] in str(caught.value)


@pytest.mark.parametrize("name", ["fifo", "socket", *DEVICES])
def test_open_regular_refuses_without_blocking(odd, name):
    start = time.monotonic()
    with pytest.raises(regular.NotRegular, match="not a regular file"):
        regular.open_regular(odd[name])
    assert time.monotonic() - start < 1.0


def test_open_regular_refuses_a_fifo_swapped_in_after_the_stat(odd, tmp_path, monkeypatch):
    """The second guard: the stat said 'regular file' (a file there then), the descriptor is a FIFO; the open
    does not block on it (O_NONBLOCK) and its fstat refuses it."""
    real = tmp_path / "real"
    real.write_bytes(b"x")
    said, stat_ = os.stat(real), os.stat  # os.stat says 'a regular file' for the FIFO alone
    monkeypatch.setattr(regular.os, "stat", lambda p, *a, **k: said if p == odd["fifo"] else stat_(p, *a, **k))
    start = time.monotonic()
    with pytest.raises(regular.NotRegular, match="FIFO"):
        regular.open_regular(odd["fifo"])
    assert time.monotonic() - start < 1.0
    with regular.open_regular(real) as f:  # a regular file reads as ever, blocking again
        assert f.read() == b"x" and os.get_blocking(f.fileno())


@pytest.mark.parametrize("name", ["fifo", "/dev/zero"])
def test_trace_load_refuses_a_fifo_or_device(odd, name):
    with pytest.raises(trace.TraceDamaged, match="not a regular file"):
        trace.load(odd[name])


@pytest.mark.parametrize("name", ["fifo", "socket", *DEVICES])
@pytest.mark.parametrize("which", [0, 1])
def test_jaxdp_diff_refuses_in_one_line_status_2_within_a_second(odd, name, which, tmp_path, capsys):
    other = tmp_path / "b.npz"
    other.write_bytes(b"PK")  # never read: the check comes first
    argv = ["diff", odd[name], str(other)] if which == 0 else ["diff", str(other), odd[name]]
    start = time.monotonic()
    code = cli.main(argv)
    took = time.monotonic() - start
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "not a regular file" in err and odd[name] in err, err
    assert took < 1.0, took


def _checkpoint_folder(tmp_path, framework: str, step_files: dict) -> str:
    """A folder as a run leaves it (marker, step 1 with a manifest), with `step_files` added after the manifest."""
    folder = tmp_path / "ck"
    (folder / "1" / "state").mkdir(parents=True)
    (folder / "1" / "state" / "data").write_bytes(b"0" * 16)
    ckpt_folder._write_marker(str(folder), framework, [1], "run")
    manifest.write(str(folder / "1"), framework, 1)
    for rel, make in step_files.items():
        make(str(folder / "1" / rel))
    return str(folder)


def _swap_in_fifo(path):
    os.remove(path)
    os.mkfifo(path)


@pytest.mark.parametrize("main, prog", [(cli.main, "jaxdp"), (torch_cli.main, "torch_ref")])
@pytest.mark.parametrize("plant", ["fifo added", "data is a fifo", "data is /dev/zero"])
def test_resume_from_a_folder_holding_what_is_not_a_file_is_refused_by_both_commands(tmp_path, capsys, main, prog,
                                                                                    plant):
    """--resume reads every file of the step: a FIFO, or a device where a file was, is refused before any work
    in one line (exit 2) within a second (nofollow.py's check), and the manifest's check on resume finds it too
    (damaged, exit 3) when it came after."""
    make = {"fifo added": {"state/extra": os.mkfifo}, "data is a fifo": {"state/data": _swap_in_fifo},
            "data is /dev/zero": {"state/data": lambda p: (os.remove(p), os.symlink("/dev/zero", p))}}[plant]
    folder = _checkpoint_folder(tmp_path, "jax" if prog == "jaxdp" else "torch", make)
    import torch_ref.checkpoint
    import torch_ref.launch
    import torch_ref.train  # noqa: F401 - imported before the clock starts: torch's import is not the check
    start = time.monotonic()
    code = main(["train", "--strategy", "single", "--steps", "2", "--checkpoint-dir", folder, "--resume"])
    took = time.monotonic() - start
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and err.startswith(f"{prog}: error: --checkpoint-dir"), err
    assert "/1/state/" in err and ("FIFO" in err or "symbolic link" in err) and took < 1.0, (err, took)
    assert manifest.problem(os.path.join(folder, "1")) is not None
    assert stat.S_ISREG(os.stat("/dev/zero").st_mode) is False  # nothing replaced: the device is as it was
