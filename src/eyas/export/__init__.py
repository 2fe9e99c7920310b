"""Checkpoint formats of the engines: export, import of published drafts, and their checks."""
