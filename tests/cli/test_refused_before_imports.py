"""A refused checkpoint folder (a FIFO, a link) is answered before JAX or torch is imported, so the one line comes
within about a second even on a loaded machine (issue 67: 5.8 s for torch_ref, 2.2 s for jaxdp, when the check came
after the imports). Read from the modules a fresh process has loaded when the command returns, not from a clock."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROBE = ("import json, sys\n"
         "from jaxdp.harness import {module} as cli\n"
         "rc = cli.main({argv!r})\n"
         "print(json.dumps([rc, 'jax' in sys.modules, 'torch' in sys.modules]))\n")


@pytest.mark.parametrize("module, first", [("cli", ["train"]), ("torch_cli", ["train"])])
def test_a_fifo_in_the_folder_is_refused_before_any_framework_loads(module, first, tmp_path):
    folder = tmp_path / "ck"
    folder.mkdir()
    (folder / "jaxdp-checkpoints.json").write_text(json.dumps(
        {"written_by": "jaxdp", "framework": "torch" if module == "torch_cli" else "jax", "run_id": "x", "steps": []}))
    os.mkfifo(folder / "q")
    argv = [*first, "--strategy", "ddp", "--devices", "2", "--steps", "2", "--checkpoint-dir", str(folder), "--resume"]
    out = subprocess.run([sys.executable, "-c", PROBE.format(module=module, argv=argv)], cwd=ROOT, timeout=120,
                         capture_output=True, text=True, env={**os.environ, "PYTHONPATH": ROOT})
    rc, jax_loaded, torch_loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert rc == 2 and "is a FIFO" in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert not jax_loaded and not torch_loaded
