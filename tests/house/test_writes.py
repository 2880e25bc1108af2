"""Every file the code writes goes through `core/files/atomic.py` (a new file renamed onto its path: a link
there is replaced, never written through) or into a folder this run made: an `open(..., "w")` in jaxdp/ or
torch_ref/ writes into a `stage` of `atomic.staged`, or is listed below with its reason."""
from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
ALLOWED = {  # (file, what the path expression reads as): why it may open for writing
    ("jaxdp/core/process/heartbeat.py", "path"): "a beat file in the launcher's own mkdtemp folder",
    ("tests/mutations/honest.py", "args.jsonl"): "--jsonl appends to the path named (RELIABILITY)",
}


def _writes(tree):
    """(line, path expression) of each `open(path, mode)` whose mode writes, appends or creates."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "open":
            mode = node.args[1] if len(node.args) > 1 else next(
                (k.value for k in node.keywords if k.arg == "mode"), None)
            if isinstance(mode, ast.Constant) and set(str(mode.value)) & set("wax+"):
                yield node.lineno, ast.unparse(node.args[0])


def test_every_write_is_atomic_or_into_a_stage():
    found = []
    for package in ("jaxdp", "torch_ref"):
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            for line, target in _writes(ast.parse(path.read_text())):
                if "stage" not in target and (rel, target) not in ALLOWED:
                    found.append(f"{rel}:{line} open({target}, ...)")
    assert not found, ("write through core/files/atomic.py (writing, write_text, write_json, staged): "
                       + "; ".join(found))
