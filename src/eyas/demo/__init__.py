"""The embedded demo: its prompts (training and held-out evaluation) and, later, its pipeline."""
