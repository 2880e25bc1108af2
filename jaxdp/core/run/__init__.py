"""The run's configuration, in NumPy only: flags, `RunConfig`, its values and readers, the data."""
