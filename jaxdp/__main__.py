"""`python -m jaxdp`: the `jaxdp` command (jaxdp/harness/cli.py)."""
import sys

from .harness.cli import main

sys.exit(main())
