"""jaxdp: data parallelism in JAX (DP, DDP, bucketed and ring all-reduce), checked against PyTorch.

Importing jaxdp does not initialise JAX's backends, so `jaxdp.devices.setup(n)` can still ask for
n simulated CPU devices afterwards.
"""
__version__ = "0.1.0"
