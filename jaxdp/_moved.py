"""The module paths jaxdp had before its core, analysis and harness packages, kept importable.

`import jaxdp.parity` (or `from jaxdp import trace`, `python -m jaxdp.mutations`) gives the module at its
new path itself, not a copy: one module object under two names, so registries, monkeypatches and
`isinstance` see one thing. A finder placed first on `sys.meta_path` answers the old names only.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

MOVED = {  # old path -> new path (a package moves with every module under it)
    "jaxdp.config": "jaxdp.core.config",
    "jaxdp.reduction": "jaxdp.core.reduction",
    "jaxdp.data": "jaxdp.core.data",
    "jaxdp.trace": "jaxdp.core.trace",
    "jaxdp.recorder": "jaxdp.core.recorder",
    "jaxdp.ulp": "jaxdp.core.ulp",
    "jaxdp.timing": "jaxdp.core.timing",
    "jaxdp.parity": "jaxdp.harness.parity",
    "jaxdp.pair_runs": "jaxdp.harness.pair_runs",
    "jaxdp.divergence": "jaxdp.harness.divergence",
    "jaxdp.relaxed": "jaxdp.harness.relaxed",
    "jaxdp.error_model": "jaxdp.harness.error_model",
    "jaxdp.cli": "jaxdp.harness.cli",
    "jaxdp.cli_diff": "jaxdp.harness.cli_diff",
    "jaxdp.report": "jaxdp.harness.report",
    "jaxdp.bench": "jaxdp.harness.bench",
    "jaxdp.mutations": "jaxdp.harness.mutations",
    "jaxdp.accounting": "jaxdp.analysis.accounting",
    "jaxdp.theory": "jaxdp.analysis.theory",
    "jaxdp.hlo": "jaxdp.analysis.hlo",
    "jaxdp.inspect": "jaxdp.analysis.inspect",
}


def new_name(name: str) -> str | None:
    """`name`'s path now, or None when it did not move."""
    for old, new in MOVED.items():
        if name == old or name.startswith(old + "."):
            return new + name[len(old):]
    return None


class OldPaths(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        new = new_name(fullname)
        if new is None:
            return None
        spec = importlib.util.find_spec(new)
        if spec is None:
            return None
        alias = importlib.util.spec_from_loader(fullname, self, is_package=spec.submodule_search_locations is not None)
        alias.loader_state = new
        return alias

    def create_module(self, spec):
        module = importlib.import_module(spec.loader_state)  # the module itself, under its old name too
        spec.loader_state = module.__spec__
        return module

    def exec_module(self, module):
        module.__spec__ = module.__spec__.loader_state  # the import system set the old name's spec: undo it

    def get_code(self, fullname):
        """`python -m old.path` (runpy asks for the code to run as __main__): code that runs the module
        at its new path as __main__, so that its relative imports resolve in its real package."""
        return compile(f"import runpy\nrunpy.run_module({new_name(fullname)!r}, run_name='__main__', alter_sys=True)\n",
                       fullname, "exec")


def install() -> None:
    if not any(isinstance(f, OldPaths) for f in sys.meta_path):
        sys.meta_path.insert(0, OldPaths())
