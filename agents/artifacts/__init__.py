"""Artifacts on the node: the manifest of a run directory and `verify`."""
