"""The trainer: data, loop, checkpoints, distributed runs, plots."""
