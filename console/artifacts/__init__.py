"""Artifacts on the console: `pull` (its data paths) and the decommission gate."""
