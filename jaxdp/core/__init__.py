"""What both frameworks share, in NumPy only (no jax, flax, optax or torch): the run configuration, the
data, the trace format and its Recorder, results, the checkpoint record; torch_ref takes only this from jaxdp."""
