"""Data preparation, the DFlash drafter, online training and evaluation (docs/trainer.md)."""
