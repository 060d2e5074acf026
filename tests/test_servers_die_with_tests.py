"""A suite killed outright (kill -9, a CI timeout's SIGTERM) leaves none of its servers
running: a test process that started a simulator and an sshd is SIGKILLed here, and both are
gone after it, where before they lived on (each in a session of its own, reparented to init).
A server started from a worker thread is left to its test's cleanup (the signal would follow
that thread)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.servers.ports import dies_with_tests, wait_until

ROOT = Path(__file__).resolve().parent.parent

STARTER = """
import sys, time
from pathlib import Path
from tests.simserver import FAST_ARGS, start_sim
from tests.servers.sshd import start_sshd
root = Path(sys.argv[1])
sim = start_sim(root, *FAST_ARGS)
sshd = start_sshd(root / "sshd")
print(sim.proc.pid, sshd.proc.pid, flush=True)
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    """True while pid is a process that is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_killed_test_process_takes_its_servers_with_it(tmp_path: Path) -> None:
    starter = subprocess.Popen([sys.executable, "-c", STARTER, str(tmp_path)], cwd=ROOT,
                               stdout=subprocess.PIPE, text=True)
    try:
        assert starter.stdout is not None
        line = starter.stdout.readline()
        assert line, "the starter exited before its servers were up"
        pids = [int(p) for p in line.split()]
        assert all(_alive(p) for p in pids)
        starter.send_signal(signal.SIGKILL)
        starter.wait(timeout=60)
        wait_until(lambda: not any(_alive(p) for p in pids), 60,
                   "the killed test process's simulator and sshd to die")
    finally:
        if starter.poll() is None:
            starter.kill()
            starter.wait()
        for p in pids if "pids" in locals() else []:
            if _alive(p):
                os.kill(p, signal.SIGKILL)


def test_only_the_main_thread_gets_the_parent_death_signal() -> None:
    import threading

    got: list[object] = []
    worker = threading.Thread(target=lambda: got.append(dies_with_tests()))
    worker.start()
    worker.join()
    assert got == [None]
    assert callable(dies_with_tests())
