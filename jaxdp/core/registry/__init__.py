"""The registry: one declared row per strategy (`strategies.py`) and per model (`models.py`), read by every
list of them (the CLI's choices, the theory, the sizes, the parity pairs, the bench, the contract's intents,
the docs' tables). Plain frozen rows, no framework imported: jaxdp and torch_ref both read it."""
from __future__ import annotations

from . import models, strategies

__all__ = ["models", "strategies"]
