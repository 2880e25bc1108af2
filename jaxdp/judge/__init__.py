"""The judge: whether two runs are the same training, and where they part (docs/PARITY.md)."""
