"""The run folder and the run around the loop: its file layout, checkpoints, resuming, the logs,
live warnings and clean stops."""
