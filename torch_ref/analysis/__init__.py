"""What a torch_ref step does, measured: the collectives and bytes read from torch's profiler, memory, and
the theory they are held against (the twin of `jaxdp/analysis/`: `accounting.py`, `theory.py`, and
`profiler.py` where JAX reads the compiled HLO)."""
