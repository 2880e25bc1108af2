"""What a compiled JAX step does, measured: collectives read from the HLO, bytes, memory, and the theory
they are held against (`jaxdp inspect`, `jaxdp memory`, the report's accounting)."""
