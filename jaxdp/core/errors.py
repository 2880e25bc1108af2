"""The errors every layer raises for a run that cannot go on, and the exit status each one means. Both
CLIs (`jaxdp`, `python -m torch_ref`) answer each with its one line and this status, never a traceback:

    0  success, or the runs agree (EXIT_OK)
    1  a MISMATCH verdict: the runs compared disagree (EXIT_MISMATCH)
    2  bad input: a flag, a configuration or a folder the run may not use; the line names the fix (EXIT_USAGE)
    3  a run or a file that failed: a damaged checkpoint or trace, a full disk, a crashed or hung rank,
       a non-finite loss, gradient or parameter (EXIT_FAILED)
"""

EXIT_OK, EXIT_MISMATCH, EXIT_USAGE, EXIT_FAILED = 0, 1, 2, 3


class ConfigError(ValueError):
    """A configuration that cannot run; the message says how to fix it (exit 2)."""


class RunFailed(RuntimeError):
    """A run or a file that failed: damaged, unreadable or hostile data, a full disk, a rank that crashed
    or hung, non-finite state (exit 3). The message names the file, step, tensor or rank."""
