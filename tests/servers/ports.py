"""Re-exported for tests: the product's local-process helpers."""

from console.localproc import free_ports, kill_pid, wait_until

__all__ = ["free_ports", "kill_pid", "wait_until"]
