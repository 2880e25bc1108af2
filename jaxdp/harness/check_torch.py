"""`jaxdp check --framework torch FILE.py:FUNCTION --devices N`: the flags checked and FUNCTION found in this
process, then one step of the user's torch program checked on a gloo CPU world of N ranks
(torch_ref/contract/world.py) and rank 0's contract printed, as `jaxdp check` prints a JAX program's."""
from __future__ import annotations

from ..contract import cli
from ..core.run import config


def main(args) -> int:
    config.require_torch("jaxdp check --framework torch")
    where, name, want = cli.checked(args)
    from torch_ref.contract import world

    text, report = world.run(where, name, args.devices, {"intent": want.name, "accumulation": want.accumulation,
                                                         "reduce_dtype": want.reduce_dtype,
                                                         "master_dtype": want.master_dtype}, args.timeout)
    return cli.shown(args, text, report)
