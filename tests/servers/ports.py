"""Re-exported for tests: the product's local-process helpers; and `dies_with_tests`."""

from __future__ import annotations

import threading
from collections.abc import Callable

from console.localproc import die_with_parent, free_ports, kill_pid, wait_until

__all__ = ["dies_with_tests", "free_ports", "kill_pid", "wait_until"]


def dies_with_tests() -> Callable[[], None] | None:
    """A `preexec_fn` for a server a test starts (SGLang, a simulator, the router, sshd): it
    is SIGKILLed when the test process dies, a kill -9 or a CI timeout's SIGTERM included
    (PR_SET_PDEATHSIG), so a killed suite leaves nothing running. Only when started from
    the main thread, which lives as long as the process: the signal follows the thread that
    started the child, so one started from a worker thread would die with that thread (it
    gets None: its test's own cleanup is all there is, as before)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    return die_with_parent()
