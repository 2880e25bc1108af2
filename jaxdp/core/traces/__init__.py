"""The trace: its file, its keys and limits, the Recorder, and comparing two traces."""
