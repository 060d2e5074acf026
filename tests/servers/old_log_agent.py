"""The real agent as a node from before log following runs it: `logs` answers carry a tail
only (path, size, lines, next_before: no next_from, inode or unfinished). Run as the node's
agent command (`python tests/servers/old_log_agent.py serve RUN --stdio`); every other
answer is the real agent's, passed through as it comes."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OLD_TAIL = ("path", "size", "lines", "next_before")


def main() -> int:
    proc = subprocess.Popen([sys.executable, "-m", "agents.cli", *sys.argv[1:]], cwd=ROOT,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None
    child_in = proc.stdin

    def feed() -> None:
        for line in sys.stdin.buffer:
            child_in.write(line)
            child_in.flush()
        child_in.close()

    threading.Thread(target=feed, daemon=True).start()
    for line in proc.stdout:
        try:
            msg = json.loads(line)
        except ValueError:
            msg = None
        result = msg.get("result") if isinstance(msg, dict) else None
        if isinstance(result, dict) and "lines" in result and "next_before" in result:
            msg["result"] = {k: v for k, v in result.items() if k in OLD_TAIL}
            line = json.dumps(msg).encode() + b"\n"
        sys.stdout.buffer.write(line)
        sys.stdout.buffer.flush()
    return proc.wait()


if __name__ == "__main__":
    sys.exit(main())
