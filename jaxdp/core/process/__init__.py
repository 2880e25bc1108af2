"""Processes and signals: launchers, heartbeats, ports, a stop obeyed by every worker."""
