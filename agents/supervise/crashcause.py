"""Why a server exited, read from the tail of its log: out of memory, a bad or unknown
argument, no model at the model path, the Hub unreachable, a port in use, or else the last
line of a Python exception. Tested on tails recorded from the real SGLang
(tests/fixtures/crash_tails/).

A deterministic cause (a bad argument, no model) comes back on every start; the supervisor
stops restarting a server that starts up into the same one twice in a row. The others may
pass: memory or a port held by a predecessor still dying, a network that returns.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from agents.rundir.schema import EXIT_CAUSES
from agents.supervise.sglang_log import LAUNCH_MARKER

# The line the supervisor writes before each start (servers.py launch), as a search finds it.
_MARKER = b"\n" + LAUNCH_MARKER.encode()
# Enough for SGLang's whole argparse usage (38 KB in 0.5.23) with its error line, or a few
# ranks' tracebacks; the cause is near the end.
TAIL_BYTES = 64 * 1024
LINE_CHARS = 400
EXCEPTION_LINES = 200

_FIX_COMMAND = ("fix [servers] command in run.toml, then down and up (restart-server reuses "
                "the command the supervisor started with)")
# kind -> (deterministic, what to do); what each is called: EXIT_CAUSES (the schema's).
KINDS: dict[str, tuple[bool, str]] = {
    "out_of_memory": (False, "another process may still hold the GPU's memory (nvidia-smi); "
                             "else lower --mem-fraction-static or the context length"),
    "unknown_argument": (True, _FIX_COMMAND),
    "bad_argument": (True, _FIX_COMMAND),
    "missing_model": (True, "put the model there and restart-server, or fix [servers] model "
                            "in run.toml (a folder with config.json, or a Hub id), then down "
                            "and up"),
    "model_unreachable": (False, "download the model to the node, or let it reach "
                                 "huggingface.co"),
    "port_in_use": (False, "another process holds the port (ss -ltnp); a dying server frees "
                           "it"),
    "exception": (False, "see the server's log"),
}

# SGLang's own prefix: `[2026-12-01 22:57:02 TP0] `, `[12:00:01 DP1 TP3] `.
_PREFIX = re.compile(r"^\[[^\]]*\d{2}:\d{2}:\d{2}[^\]]*\]\s*")
# In the order they are looked for: the first kind found names the cause.
_PATTERNS: list[tuple[str, re.Pattern[str]]] = [
    ("unknown_argument", re.compile(r"error: unrecognized arguments: ")),
    ("bad_argument", re.compile(r"error: (argument [^:]+: |the following arguments are "
                                r"required: )")),
    ("missing_model", re.compile(
        r"Repo id must be in the form|is not a local folder and is not a valid model "
        r"identifier|does not appear to have a file named config\.json|Unrecognized model "
        r"in .* Should have a `model_type` key|RepositoryNotFoundError")),
    ("model_unreachable", re.compile(r"We couldn't connect to 'https://huggingface\.co'")),
    ("out_of_memory", re.compile(
        r"CUDA out of memory|OutOfMemoryError|CUDA error: out of memory|HIP out of memory|"
        r"Not enough memory\. Please try to increase --mem-fraction-static|"
        r"DefaultCPUAllocator: can't allocate memory")),
    ("port_in_use", re.compile(r"[Aa]ddress already in use|\[Errno 98\]|Port is already in "
                               r"use|port\w* at \d+ is not available")),
]
# The last line of a traceback: `ValueError: ...`, `torch.OutOfMemoryError: ...`, `KeyError`.
_EXCEPTION = re.compile(r"^(?:[A-Za-z_][\w]*\.)*[A-Za-z_]\w*(?:Error|Exception|Exit|"
                        r"Interrupt|Failure)(?::\s.*)?$")
# Lines that say "look above": never the cause when another line names one.
_WRAPPERS = ("Initialization failed. Please see the error messages above",)


@dataclass(frozen=True, slots=True)
class CrashCause:
    kind: str
    line: str  # the log line that says it, without SGLang's [time rank] prefix

    @property
    def label(self) -> str:
        return EXIT_CAUSES[self.kind]

    @property
    def deterministic(self) -> bool:
        return KINDS[self.kind][0]

    @property
    def advice(self) -> str:
        return KINDS[self.kind][1]

    def text(self) -> str:
        """`out of memory: torch.OutOfMemoryError: CUDA out of memory. Tried to ...`"""
        return f"{self.label}: {self.line}"


def _clean(line: str) -> str:
    line = _PREFIX.sub("", line.strip())
    return line if len(line) <= LINE_CHARS else line[:LINE_CHARS - 1] + "…"


def classify(tail: str) -> CrashCause | None:
    """The cause a server's last output names, or None when it names none."""
    lines = tail.splitlines()
    for kind, pattern in _PATTERNS:
        for line in reversed(lines):
            if pattern.search(line):
                return CrashCause(kind, _clean(line))
    # Any exception only near the end: one a long-running server logged hours before it was
    # killed (SIGKILL prints nothing) is not why it exited.
    for line in reversed(lines[-EXCEPTION_LINES:]):
        if _EXCEPTION.match(_PREFIX.sub("", line)) and not any(w in line for w in _WRAPPERS):
            return CrashCause("exception", _clean(line))
    return None


def read_tail(log: Path) -> str:
    """The end of a server's log since its last launch marker (what its latest start wrote),
    at most TAIL_BYTES; "" when there is no log."""
    try:
        with open(log, "rb") as fh:
            fh.seek(0, 2)
            size = fh.tell()
            fh.seek(max(0, size - TAIL_BYTES))
            data = fh.read(TAIL_BYTES)
    except OSError:
        return ""
    at = data.rfind(_MARKER)
    if at >= 0:
        data = data[data.index(b"\n", at + 1) + 1:] if b"\n" in data[at + 1:] else b""
    return data.decode(errors="replace")
