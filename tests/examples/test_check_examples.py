"""examples/check_jax.py and examples/check_torch.py, run as docs/CHECK.md shows them (`jaxdp check`, in this
process): each example's honest function keeps its contract (exit 0) and its broken twin departs with the
finding the example names (exit 1); the torch ones on a gloo world of 2 ranks. A torch FUNCTION that returns
the wrong thing is answered in one line (exit 2), one that raises is a failed run (exit 3)."""
from __future__ import annotations

import json
import os

import pytest

from jaxdp.harness import cli
from tests import REPO

pytestmark = pytest.mark.filterwarnings("ignore")
JAX, TORCH = os.path.join(REPO, "examples", "check_jax.py"), os.path.join(REPO, "examples", "check_torch.py")


def check(argv, capsys) -> tuple[int, str, str]:
    code = cli.main(["check", *argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("function,status,kind", [("make", 0, None), ("make_bf16_params", 1, "master-dtype")])
def test_the_jax_example(function, status, kind, capsys, tmp_path):
    code, out, err = check([f"{JAX}:{function}", "--devices", "2", "--intent", "ddp", "--json",
                            str(tmp_path / "r.json")], capsys)
    report = json.loads((tmp_path / "r.json").read_text())
    assert code == status, out + err
    assert [f["kind"] for f in report["findings"]][:1] == ([kind] if kind else []), out
    assert "master dtype float32" in out and "all-reduce" in out


@pytest.mark.parametrize("function,status,kind", [("make", 0, None),
                                                  ("make_without_no_sync", 1, "sync-per-microbatch")])
def test_the_torch_example_on_a_world_of_2(function, status, kind, capsys, tmp_path):
    code, out, err = check(["--framework", "torch", f"{TORCH}:{function}", "--devices", "2", "--intent", "ddp",
                            "--accumulation", "2", "--timeout", "300", "--json", str(tmp_path / "r.json")], capsys)
    report = json.loads((tmp_path / "r.json").read_text())
    assert code == status, out + err
    assert [f["kind"] for f in report["findings"]][:1] == ([kind] if kind else []), out
    (grads,) = [c for c in report["collectives"] if c["op"] == "all-reduce"]
    assert (grads["dtype"], grads["count"], grads["group"]) == ("float32", 2 if kind else 1, 2), out
    assert report["facts"]["backend"] == "gloo" and out.startswith("communication contract: intent ddp")


BAD = '''
def wrong(rank, world):
    return None


def broken(rank, world):
    raise ValueError("the user's own error")
'''


@pytest.mark.parametrize("argv,status,words", [
    (["{tmp}/user.py:absent"], 2, "has no function 'absent'"),
    (["{tmp}/user.py:wrong", "--target", "h100"], 2, "--target is for --framework jax"),
    (["{tmp}/user.py:wrong", "--timeout", "0"], 2, "--timeout 0.0: must be a finite number of seconds > 0"),
    (["{tmp}/user.py:wrong", "--master-dtype", "float64", "--devices", "0"], 2, "--devices 0"),
    (["{tmp}/user.py:wrong"], 2, "returned NoneType; it must return (step, args, model, optimizer)"),
    (["{tmp}/user.py:broken"], 3, "ValueError: the user's own error"),
])
def test_bad_torch_input_is_one_line(argv, status, words, capsys, tmp_path):
    (tmp_path / "user.py").write_text(BAD)
    given = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    defaults = [a for flag, value in (("--devices", "2"), ("--timeout", "300")) if flag not in given
                for a in (flag, value)]
    code, _, err = check(["--framework", "torch", *defaults, *given], capsys)
    assert code == status and err.count("\n") == 1 and words in err, err


def test_the_jax_example_runs_the_check_on_itself(monkeypatch, capsys, tmp_path):
    """`python examples/check_jax.py --function make_bf16_params`: the same check as its `jaxdp check` line."""
    from tests.examples.test_examples import run_example

    code, out, _ = run_example("check_jax.py", ["--function", "make_bf16_params"], monkeypatch, capsys, tmp_path)
    assert code == 1 and "DEPARTS [master-dtype]" in out, out
