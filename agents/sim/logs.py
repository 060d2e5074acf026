"""The SGLang simulator's log lines on stdout, in SGLang's format: `[time{ DPn}{ TPn}] message`."""

from __future__ import annotations

import time

# `%H:%M:%S` when playing SGLang up to 0.3.3 (cli.py sets it from --sglang-version).
DATE_FORMAT = "%Y-%m-%d %H:%M:%S"


def log(message: str, tags: str = "") -> None:
    """One SGLang-format line: `[YYYY-MM-DD HH:MM:SS{ DPn}{ TPn}] message`, flushed."""
    print(f"[{time.strftime(DATE_FORMAT)}{tags}] {message}", flush=True)
