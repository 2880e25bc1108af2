"""Put on PYTHONPATH by tests/touched.py during the quick tier: every Python process the quick tests start
(a CLI in a subprocess, the fork server of torch ranks and each rank it forks) runs under cProfile and, at
exit, writes what it touched to the session's folder, as the pytest processes do."""
import os

if os.environ.get("JAXDP_TESTS_TOUCHED_DIR"):
    import atexit
    import cProfile

    _profile = cProfile.Profile()
    _profile.enable()

    def _write():
        import sys

        _profile.disable()
        _profile.create_stats()
        folder, pid = os.environ["JAXDP_TESTS_TOUCHED_DIR"], os.getpid()
        called = {os.path.realpath(f) for f, _, name in _profile.stats if name != "<module>"}
        ran = {os.path.realpath(f) for f, _, name in _profile.stats if name == "<module>"}
        ran |= {os.path.realpath(m.__file__) for m in list(sys.modules.values()) if getattr(m, "__file__", None)}
        try:
            with open(os.path.join(folder, f"{pid}-site.called"), "w") as f:
                f.write("\n".join(sorted(called)))
            with open(os.path.join(folder, f"{pid}-site.ran"), "w") as f:
                f.write("\n".join(sorted(ran)))
        except OSError:  # the session (and its folder) is gone
            pass

    atexit.register(_write)

    def _forked():  # a torch rank forked by its fork server: multiprocessing ends it with os._exit, no atexit
        from multiprocessing import util

        util.Finalize(None, _write, exitpriority=0)

    import multiprocessing.util

    multiprocessing.util.register_after_fork(_profile, lambda _: _forked())


def _chain() -> None:
    """Python imports one `sitecustomize`, the first on the path: run the next one too (tests/without_hf's, which
    hides an extra: the quick tier without it, docs/TESTS.md), so that this one stacks with it."""
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    for folder in sys.path:
        other = os.path.join(folder or ".", "sitecustomize.py")
        if os.path.abspath(folder or ".") != here and os.path.isfile(other):
            with open(other) as f:
                exec(compile(f.read(), other, "exec"), {"__name__": "sitecustomize_chained", "__file__": other})
            return


_chain()
