"""For the whole test session (tests/ and parity_tests/, and every process they start): a persistent
XLA compilation cache in a fresh temporary folder. Programs compiled once in the session (the same
step built again by another test, a CLI subprocess, a spawned example, the other process of a
multi-process run) are then read back instead of compiled again. The folder is new for each session,
so nothing compiled by an earlier run (or another JAX version) is ever used; set
JAX_COMPILATION_CACHE_DIR yourself to keep one across sessions."""
import os
import tempfile

if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="jaxdp-xla-cache-")
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"  # every program: the small ones add up
    os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "-1"
