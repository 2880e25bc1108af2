"""The error every layer raises for a configuration that cannot run (both frameworks, every entry point
answers it with its one line)."""


class ConfigError(ValueError):
    """A configuration that cannot run; the message says how to fix it."""
