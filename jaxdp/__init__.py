"""jaxdp: data parallelism in JAX (DP, DDP, bucketed and ring all-reduce, ZeRO, HSDP), checked against PyTorch.

The library API (docs/LIBRARY.md): `jaxdp.setup_devices(n)`, `jaxdp.parallelize(loss_fn, params,
optimizer, strategy=...)`, `jaxdp.trace.Recorder(path, meta, optimizer=...)`,
`jaxdp.diff(a, b)` (the `Verdict` of trace a against reference b), `jaxdp.check(step, *args, intent=...)`
(what a jitted step really communicates against what was meant: docs/CHECK.md).

Importing jaxdp does not initialise JAX's backends (nor import JAX): the API is loaded on first
use, so `jaxdp.setup_devices(n)` can still ask for n simulated CPU devices afterwards. Besides the
packages, three plain modules keep the paths the docs give users: `jaxdp.trace` (the trace and its
Recorder), `jaxdp.parity` (`judge`) and `jaxdp.divergence` (`compare`).
"""
__version__ = "0.1.0"


def _quiet_cuda_plugin() -> None:
    """With the `gpu-aot` extra (JAX's CUDA plugin and its compiler, no cuDNN or cuBLAS: docs/GPU.md), JAX
    would print a traceback at start on any machine, its check of the CUDA libraries failing: the check is
    for running on a GPU, which that install cannot do, so it is skipped there (JAX then picks the CPU
    silently). Set before JAX starts its backends; a full CUDA install (cuDNN present) keeps its check."""
    import importlib.util
    import os

    try:
        plugin = importlib.util.find_spec("jax_plugins.xla_cuda12") is not None
        full = importlib.util.find_spec("nvidia.cudnn") is not None
    except ModuleNotFoundError:
        plugin, full = False, False
    if plugin and not full:
        os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")


_quiet_cuda_plugin()

_LAZY = {"setup_devices": "api", "parallelize": "api", "Parallel": "api", "diff": "judge.verdict",
         "Verdict": "judge.verdict", "check": "contract.check"}
__all__ = ["Parallel", "Verdict", "check", "diff", "parallelize", "setup_devices"]


def __getattr__(name):
    import importlib

    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    if name in ("trace", "optim", "divergence", "parity"):  # `jaxdp.trace.Recorder` after a bare `import jaxdp`
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'jaxdp' has no attribute {name!r}")
