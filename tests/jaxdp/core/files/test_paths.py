"""Output paths are checked by trying (jaxdp/core/files/paths.py): a temporary file is created in the folder that
will receive the output and removed, before any work. `os.access` answers yes to root on a read-only
filesystem; the try does not. A flag given twice with different values (argv.py) is refused in one line."""
from __future__ import annotations

import errno
import os
import tempfile

import pytest

from jaxdp.core.errors import ConfigError
from jaxdp.core.files import paths


def _read_only(monkeypatch, folder):
    """Creating a file in `folder` fails as on a read-only mount, while os.access still says yes."""
    real = tempfile.mkstemp

    def mkstemp(*args, dir=None, **kwargs):
        if dir is not None and os.path.abspath(dir) == os.path.abspath(folder):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS))
        return real(*args, dir=dir, **kwargs)

    monkeypatch.setattr(tempfile, "mkstemp", mkstemp)
    monkeypatch.setattr(os, "access", lambda *a, **k: True)


@pytest.mark.parametrize("check,flag,sub", [(paths.output_file, "--trace", "out/t.npz"),
                                            (paths.output_file, "--json", "i.json"),
                                            (paths.output_dir, "--out", "reports/compare"),
                                            (paths.output_dir, "--checkpoint-dir", "")])
def test_a_folder_that_cannot_be_written_is_refused_though_os_access_says_yes(check, flag, sub, tmp_path,
                                                                               monkeypatch):
    check(os.path.join(tmp_path, sub) if sub else tmp_path, flag)  # honest: accepted
    _read_only(monkeypatch, tmp_path)
    with pytest.raises(ConfigError, match=f"^{flag} .*cannot write in folder {tmp_path} \\(Read-only file system\\); "
                                          "choose a writable path$"):
        check(os.path.join(tmp_path, sub) if sub else tmp_path, flag)
    assert sorted(os.listdir(tmp_path)) == []  # the honest try left nothing behind


def test_an_existing_file_in_a_read_only_folder_is_refused(tmp_path, monkeypatch):
    (tmp_path / "t.npz").write_bytes(b"")
    _read_only(monkeypatch, tmp_path)
    with pytest.raises(ConfigError, match="--trace .*t.npz: cannot write in folder"):
        paths.output_file(tmp_path / "t.npz", "--trace")


@pytest.mark.skipif(not os.path.isdir("/proc/self"),
                    reason="needs Linux's /proc (a pseudo-filesystem os.access passes for root); the portable case, "
                           "a write refused where os.access says yes, is tested above on every system")
def test_a_path_under_proc_is_refused():
    """/proc: os.access says yes to root; creating a file there fails."""
    for check, flag, path in ((paths.output_file, "--trace", "/proc/jaxdp/t.npz"),
                              (paths.output_dir, "--out", "/proc/x")):
        with pytest.raises(ConfigError, match=f"^{flag} {path}: cannot write in folder /proc "):
            check(path, flag)


@pytest.mark.parametrize("argv_,both", [
    (["memory", "--strategies", "ddp", "--strategy", "zero3"], "--strategies ddp and --strategy zero3"),
    (["train", "--steps", "3", "--steps", "4"], "--steps 3 and --steps 4"),
    (["train", "--progress", "--no-progress"], "--progress True and --no-progress False"),
    (["compare", "--out", "a", "--out=b"], "--out a and --out b"),
])
def test_a_flag_given_twice_with_different_values_is_one_line(argv_, both, capsys):
    from jaxdp.harness import cli

    with pytest.raises(SystemExit) as e:
        cli.main(argv_)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1, err
    assert f"{both}: the same flag given twice with different values; give it once" in err, err


def test_the_same_value_twice_is_harmless():
    from jaxdp.harness import cli

    args = cli.build_parser().parse_args(["memory", "--strategy", "ddp,zero3", "--strategies", "ddp,zero3"])
    assert args.strategies == ["ddp", "zero3"]
