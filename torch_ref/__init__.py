"""torch_ref: the PyTorch reference of jaxdp's strategies (single, dp, ddp, ddp-naive, ddp-bucket,
ddp-ring, zero1, zero2, zero3/fsdp, hsdp), with the same flags and the same trace format.

`python -m torch_ref train ...`; from Python: `torch_ref.train.run(RunConfig(...), trace_path=..., init=...)`
(`jaxdp.harness.torch_run.run` passes the JAX side's initial parameters as `init`); as a library for
your own model: `torch_ref.parallelize`, `torch_ref.train_step`, `torch_ref.trace.Recorder` (torch_ref/api.py);
what a step really sends against what was meant: `torch_ref.check` (docs/CHECK.md).
"""
import os

# libgomp's default spin-waiting makes multi-threaded CPU torch ~100x slower on small machines
# (measured in docs/BENCHMARKS.md); sleep-waiting threads cost nothing on large ones. Must be set
# before torch is first imported; an explicit user setting wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__version__ = "0.1.0"

# torch loads on first use, not on `import torch_ref`
_LAZY = {"parallelize": "api", "train_step": "api", "check": "contract.check"}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    if name in ("trace", "convert"):  # `torch_ref.trace.Recorder` after a bare `import torch_ref`
        import importlib

        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
