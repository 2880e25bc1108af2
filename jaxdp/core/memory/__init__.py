"""A run's bytes per device from shapes alone, and the sizes checked before any work."""
