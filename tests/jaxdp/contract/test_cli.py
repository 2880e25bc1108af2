"""`jaxdp check FILE.py:FUNCTION`: the contract printed (exit 0 kept, 1 departed), the report as JSON, and bad input
answered in one line with exit 2 before any work; a FUNCTION that raises is a failed run (exit 3)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from jaxdp.harness import cli
from tests import REPO

USER = '''
import jax, numpy as np, optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P


def make(devices):
    mesh = Mesh(np.array(devices), ("data",))
    params = {"w": jax.device_put(np.ones((8, 4), np.float32), NamedSharding(mesh, P()))}
    tx = optax.sgd(0.1)
    opt = tx.init(params)
    x = jax.device_put(np.ones((8, 8), np.float32), NamedSharding(mesh, P("data")))

    @jax.jit
    def step(params, opt, x):
        g = jax.grad(lambda p: ((x @ p["w"]) ** 2).mean())(params)
        u, opt = tx.update(g, opt)
        return optax.apply_updates(params, u), opt
    return step, (params, opt, x)
'''


def jaxdp(*argv):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "jaxdp", "check", *argv], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)


def test_a_users_file_keeps_its_contract(tmp_path):
    (tmp_path / "train.py").write_text(USER)
    done = jaxdp(f"{tmp_path}/train.py:make", "--devices", "2", "--intent", "ddp")
    assert done.returncode == 0, done.stderr
    assert "all-reduce" in done.stdout and "OK: the program communicates as ddp intends" in done.stdout


def test_a_departure_exits_1_and_the_json_names_it():
    done = jaxdp("tests.jaxdp.contract.seeded_jax:bf16_reduce", "--json", "-")
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    assert report["ok"] is False and report["findings"][0]["kind"] == "reduce-dtype"
    assert "DEPARTS [reduce-dtype]" in done.stderr


@pytest.mark.quick
@pytest.mark.parametrize("argv,status,words", [
    (["nocolon"], 2, "give FILE.py:FUNCTION"),
    (["{tmp}/none.py:make"], 2, "no such file"),
    (["{tmp}/train.py:absent"], 2, "has no function 'absent'"),
    (["{tmp}/train.py:make", "--accumulation", "0"], 2, "--accumulation 0 must be a whole number >= 1"),
    (["{tmp}/train.py:broken"], 3, "ValueError: the user's own error"),
])
def test_bad_input_is_one_line(argv, status, words, tmp_path, capsys):
    (tmp_path / "train.py").write_text("def make(devices):\n    return None\n\n\ndef broken(devices):\n"
                                       "    raise ValueError(\"the user's own error\")\n")
    code = cli.main(["check", *(a.replace("{tmp}", str(tmp_path)) for a in argv)])
    err = capsys.readouterr().err
    assert code == status and err.count("\n") == 1 and words in err, err
