"""--target's programs compiled once (analysis/program_cache.py): the second inspect of a shape reads the first's
reading back, the same projection follows; a cache folder that is a link, or an entry that is one, is not used."""
from __future__ import annotations

import os

import pytest

from jaxdp.analysis import inspect, program_cache
from jaxdp.core.run import targets
from jaxdp.core.run.config import RunConfig

pytestmark = pytest.mark.skipif(not targets.extra_installed(), reason='needs pip install -e ".[gpu-aot]"')
TINY = RunConfig(model="mlp", hidden=(8,), devices=2, batch_size=8, strategy="ddp", dtype="bfloat16").validate()


def test_a_shape_compiled_once_is_read_back_with_the_same_projection(monkeypatch, tmp_path):
    monkeypatch.setenv(program_cache.ENV, str(tmp_path / "cache"))
    first = inspect.inspect(TINY, target="h100")
    second = inspect.inspect(TINY, target="h100")
    assert (first["cache"]["hit"], second["cache"]["hit"]) == (False, True)
    assert second["projection"] == first["projection"] and second["collectives"] == first["collectives"]
    assert os.listdir(tmp_path / "cache") == [os.path.basename(first["cache"]["path"])]
    other = inspect.inspect(TINY.replace(batch_size=16).validate(), target="h100")
    assert not other["cache"]["hit"]  # another shape, another program


def test_a_linked_folder_or_entry_is_not_followed(monkeypatch, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.symlink(elsewhere, tmp_path / "link")
    monkeypatch.setenv(program_cache.ENV, str(tmp_path / "link"))
    r = inspect.inspect(TINY, target="h100")
    assert "link" in r["cache"]["unused"] and r["cache"]["path"] is None and os.listdir(elsewhere) == []
    assert r["projection"]["step_s"] > 0  # compiled all the same
    planted = tmp_path / "planted.json"
    planted.write_text('{"format": 1, "inspect": {}, "kernels": []}')
    os.symlink(planted, tmp_path / "entry.json")
    assert program_cache.load(str(tmp_path / "entry.json")) is None and program_cache.load(str(planted))


def test_the_calibration_table_and_inspect_share_one_entry(monkeypatch, tmp_path, capsys):
    """calibration_points compiles the same shapes as `inspect --target` under the same key: the entry it writes
    must be inspect's whole reading (its contract too), or inspect reads it back without one."""
    from jaxdp.analysis import calibration_points

    monkeypatch.setenv(program_cache.ENV, str(tmp_path / "cache"))
    calibration_points._program.cache_clear()
    calibration_points._program(TINY, 1)
    assert inspect.main(TINY, target="h100") == 0
    assert "contract" in inspect.inspect(TINY, target="h100")


def test_xla_flags_are_part_of_the_key(monkeypatch):
    """XLA_FLAGS change what XLA:GPU compiles (its latency-hiding scheduler, its combiners): another entry."""
    monkeypatch.setenv("XLA_FLAGS", "")
    plain = program_cache.key(TINY, "h100", 1)
    monkeypatch.setenv("XLA_FLAGS", "--xla_gpu_enable_latency_hiding_scheduler=false")
    assert program_cache.key(TINY, "h100", 1) != plain
