"""examples/port_your_model.py, smoke-tested: a model written in JAX and in torch, trained through
both library APIs, diffed; the planted bug (one tensor, one step) is named as the first divergence."""
import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_port_example_names_the_planted_bug(tmp_path):
    out = tmp_path / "port"
    argv = [sys.executable, os.path.join(REPO, "examples", "port_your_model.py"), "--plant-bug", "--quick",
            "--strategy", "zero3", "--devices", "2", "--accum", "2", "--out", str(out)]
    run = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=tmp_path,
                         env={k: v for k, v in os.environ.items() if k != "XLA_FLAGS"})
    assert run.returncode == 1, run.stdout + run.stderr[-3000:]  # a divergence: exit 1, as jaxdp diff
    assert "first divergence: step 2, param, norm/bias" in run.stdout, run.stdout
    first = json.loads((out / "diff.json").read_text())["first_divergence"]
    assert (first["step"], first["field"], first["name"]) == (2, "param", "norm/bias")
    assert "norm/bias" in (out / "diff.html").read_text()
