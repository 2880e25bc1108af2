"""The fork server's start-up: `torch_ref.launch` starts ranks with multiprocessing's 'forkserver', a
process that imports this module (hence torch and torch_ref) once and forks every rank from itself (a rank
starts in a fraction of a second, where 'spawn' imported torch again in each: about 4 CPU-seconds a rank).

Importing this module is that start-up, and runs only in the server (`fork_context.PRELOAD` names it):
the server is bound to its parent, the launcher (`jaxdp.core.process.lifeline`: the kernel kills it the instant the
launcher dies), and each rank is bound to the server the same way, so a killed launcher takes the server
and its ranks with it. multiprocessing's own rule does not: the server waits until every process holding
its 'alive' pipe is gone, and each rank holds one.
"""
from __future__ import annotations

import os

from jaxdp.core.process import lifeline

lifeline.bind_to(os.getppid())

# After the binding: a launcher killed during these imports takes the server too. Imported once here, they are
# shared by every rank forked from this process.
import torch  # noqa: E402,F401
import torch._dynamo  # noqa: E402,F401  (torch.optim's first step imports it: 0.7-1.4 CPU-s a rank otherwise)
import torch.distributed  # noqa: E402,F401

import torch_ref.train  # noqa: E402,F401
