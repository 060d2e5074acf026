"""Lending the terminal to another program (a shell on a node) and taking it back: the app
suspended and its repaints held, Ctrl-C, Ctrl-\\ and Ctrl-Z left to the program, and the
terminal's foreground taken back if the program kept it."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from textual.app import App

# The keys that signal the terminal's foreground: the program's while it runs, not ours.
PROGRAM_SIGNALS = (signal.SIGINT, signal.SIGQUIT, signal.SIGTSTP)


def _default_signals() -> None:
    """In the child, before exec: a signal ignored here would stay ignored in the program and
    in every command a local shell starts (Ctrl-C could not stop them)."""
    for sig in PROGRAM_SIGNALS:
        signal.signal(sig, signal.SIG_DFL)


@contextmanager
def _signals_to_the_program() -> Iterator[None]:
    """As system(3) does: while the program runs, these keys are ignored here. Otherwise a
    Ctrl-C before ssh sets its terminal raw (or in a local shell without job control) would
    reach asyncio.run's handler and end the app."""
    before = {sig: signal.getsignal(sig) for sig in PROGRAM_SIGNALS}
    for sig in PROGRAM_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    try:
        yield
    finally:
        for sig, handler in before.items():
            if handler is not None:  # None: set outside Python, left as the program left it
                signal.signal(sig, handler)


def _take_foreground() -> None:
    """An interactive shell makes its own process group the terminal's foreground; one that
    exits without giving it back would leave the app's next read stopped (SIGTTIN)."""
    stream = sys.__stdin__
    if stream is None or not stream.isatty():
        return
    fd = stream.fileno()
    try:
        if os.tcgetpgrp(fd) == os.getpgrp():
            return
        old = signal.signal(signal.SIGTTOU, signal.SIG_IGN)  # a background group may set it
        try:
            os.tcsetpgrp(fd, os.getpgrp())
        finally:
            signal.signal(signal.SIGTTOU, old)
    except OSError:
        pass  # no controlling terminal: nothing to take back


async def run_in_terminal(app: App[Any], argv: list[str], cwd: str | None = None,
                          held: Callable[[int], str | None] = lambda _code: None) -> int:
    """Run argv on the terminal, the app suspended, until it exits; its exit status. When
    held(status) gives a text, it is shown and Enter awaited before the app draws again.
    Raises textual.app.SuspendNotSupported where there is no terminal to lend (headless, web)
    and OSError when argv cannot start (the app is back at once)."""
    # The loop goes on while the program runs: links stay up, snapshots and alerts are kept.
    # Repaints are held, outermost so that they resume only after the app has: suspend()
    # stops Textual's writer thread, and a repaint would fill its bounded queue and block the
    # loop for good (terok-ai/terok#1187, Textual 8.2.8).
    with app.batch_update(), app.suspend(), _signals_to_the_program():
        proc = await asyncio.create_subprocess_exec(*argv, cwd=cwd, preexec_fn=_default_signals)
        try:
            code = await proc.wait()
        finally:
            if proc.returncode is None:  # cancelled (the app closing): the program goes too
                proc.kill()
                await proc.wait()
            _take_foreground()
        note = held(code)
        if note:
            print(note, flush=True)
            await asyncio.to_thread(sys.stdin.readline)
    return code
