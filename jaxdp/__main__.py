"""`python -m jaxdp`: the `jaxdp` command (jaxdp/harness/cli.py). A child of `jaxdp train --processes` first
binds its life to the launcher's and starts its heartbeat, before the slow imports (jaxdp.core.process.lifeline)."""
import sys

from .core.process import heartbeat, lifeline

lifeline.bind_to(lifeline.from_env())
heartbeat.start(*heartbeat.from_env())

from .harness.cli import main  # noqa: E402

sys.exit(main())
