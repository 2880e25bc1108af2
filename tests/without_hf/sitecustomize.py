"""An install without the `hf` extra, simulated: with this folder first on PYTHONPATH every Python process
(pytest, its workers, every child a test starts) finds no `transformers`, as where it is not installed:
`import transformers` raises ModuleNotFoundError and `importlib.util.find_spec("transformers")` is None.

    PYTHONPATH=tests/without_hf:. python -m pytest -m quick

(docs/TESTS.md). The path finder is wrapped, not replaced: every other module is found as before."""
import sys
from importlib.machinery import PathFinder

HIDDEN = ("transformers",)


class WithoutHF(PathFinder):
    @classmethod
    def find_spec(cls, fullname, path=None, target=None):
        if fullname.split(".")[0] in HIDDEN:
            return None
        return PathFinder.find_spec(fullname, path, target)


sys.meta_path[:] = [WithoutHF if finder is PathFinder else finder for finder in sys.meta_path]
