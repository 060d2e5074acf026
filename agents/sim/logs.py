"""The SGLang simulator's log lines on stdout, in SGLang's format: `[time{ DPn}{ TPn}] message`."""

from __future__ import annotations

import time


def log(message: str, tags: str = "") -> None:
    """One SGLang-format line: `[YYYY-MM-DD HH:MM:SS{ DPn}{ TPn}] message`, flushed."""
    print(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}{tags}] {message}", flush=True)
