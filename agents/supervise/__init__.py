"""Supervision: the run supervisor, its SGLang servers, their figures, alerts and the
status snapshot."""
