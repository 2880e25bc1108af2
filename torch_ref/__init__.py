"""torch_ref: the PyTorch reference of jaxdp's strategies (single, dp, ddp, ddp-naive, ddp-bucket,
ddp-ring, zero1, zero2, zero3/fsdp), with the same flags and the same trace format.

`python -m torch_ref train ...`; from Python: `torch_ref.train.run(RunConfig(...), trace_path=...)`.
"""
__version__ = "0.1.0"
