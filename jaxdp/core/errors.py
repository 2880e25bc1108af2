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


# The exit-status table, as the CLIs' `-h` epilog shows it.
EPILOG = ("exit status: 0 success or the runs agree; 1 a MISMATCH verdict; 2 bad input (a flag, configuration "
          "or folder the run may not use); 3 a run or file that failed (damaged or hostile file, full disk, crashed "
          "or hung rank, non-finite state); 130 or 143 stopped by SIGINT or SIGTERM (the step saved, when "
          "checkpointing)")


def exit_status(error: BaseException) -> int:
    """The status a CLI answers `error` with (its one line goes to stderr): a failed run or file, or an
    operating-system error (a full disk, an unreadable file), 3; any other error a CLI answers is bad input, 2."""
    return EXIT_FAILED if isinstance(error, (RunFailed, OSError)) else EXIT_USAGE


def one_line(error: BaseException) -> str:
    """`error` as the CLI's one line: an OSError as 'FILE: reason' (its repr runs to an errno tuple)."""
    if isinstance(error, OSError) and error.strerror:
        where = f"{error.filename}: " if error.filename is not None else ""
        return f"{where}{error.strerror}"
    return str(error) or type(error).__name__
