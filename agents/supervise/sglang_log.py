"""Reading an SGLang server's log: its decode and prefill batch lines (every form from 0.2 to
0.5.23, single- and multi-rank), its retraction lines, its start-up facts, and one figure per
server from the newest line of each DP rank. Shapes: tests/fixtures/sglang/SOURCES.md."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

# A record may start anywhere in a line (streamed model text without a newline before it),
# with or without its `[time tags]` prefix; `Decode batch [N],` is 0.5.4's form.
_HEAD = re.compile(r"(?:\[(?P<prefix>[^\[\]\n]*)\]\s*)?(?P<kind>Decode|Prefill) batch"
                   r"(?: \[(?P<iter>\d+)\])?[.,] ?")
_TAG = re.compile(r"([A-Z][A-Z_]*?)(\d+)")
_INT = re.compile(r"-?\d+")
_GRAPH = re.compile(r"\w+ graph")
_CAPACITY = re.compile(r"\bmax_total_num_tokens=\d+")
_PAIR = re.compile(r"(\w+)=([-0-9.]+)")
_UVICORN = re.compile(r"Uvicorn running on (\S+)")
# The scheduler's line when decoding runs out of KV room and running requests go back to the
# queue: "KV cache pool is full. Retract requests." (0.5.x), "Decode out of memory happened."
# and "decode out of memory happened," before, "Testing retraction." in SGLang's debug mode.
_RETRACT = re.compile(r"(?:\[(?P<prefix>[^\[\]\n]*)\]\s*)?(?:KV cache pool is full\. Retract "
                      r"requests\.|[Dd]ecode out of memory happened[.,]|Testing retraction\.) "
                      r"#retracted_reqs: (?P<n>\d+)")
READY = "The server is fired up and ready to roll!"
# What the supervisor writes into a server's log before each launch (servers.py): what
# follows is a new process, so what came before no longer describes the server.
LAUNCH_MARKER = "# fleetdeck: launching"

Value = int | float | bool

# Whole keys only: `block accept len` (DSpark) is not `accept len`.
_FIELDS = {
    "#running-req": "running_reqs", "#queue-req": "queued_reqs",
    "#token": "num_tokens", "#full token": "num_tokens",
    "token usage": "token_usage", "full token usage": "token_usage",
    "gen throughput (token/s)": "gen_throughput",
    "accept len": "accept_length_log", "accept rate": "accept_rate",
    "#new-seq": "new_seqs", "#new-token": "new_tokens", "#cached-token": "cached_tokens",
    "#pending-token": "pending_tokens", "input throughput (token/s)": "input_throughput",
}
# Printed by some versions and deployments only; kept as extras under these names.
_EXTRAS = {
    "cache hit rate": "cache_hit_rate_pct", "largest-len": "largest_len",
    "mamba usage": "mamba_usage", "mamba num": "mamba_num",
    "#swa token": "swa_num_tokens", "swa token usage": "swa_token_usage",
    "pre-allocated usage": "pre_allocated_usage", "#prealloc-req": "prealloc_reqs",
    "#transfer-req": "transfer_reqs", "#retracted-req": "retracted_reqs",
}
_INT_FIELDS = {"running_reqs", "queued_reqs", "num_tokens", "new_seqs", "new_tokens",
               "cached_tokens", "pending_tokens"}


@dataclass(slots=True)
class BatchRecord:
    """One `Decode batch` or `Prefill batch` record; None where the line does not carry it."""

    kind: str  # "decode" | "prefill"
    timestamp: str | None
    ranks: dict[str, int]
    running_reqs: int | None = None
    queued_reqs: int | None = None
    num_tokens: int | None = None
    token_usage: float | None = None
    gen_throughput: float | None = None
    accept_length_log: float | None = None
    accept_rate: float | None = None
    graph: bool | None = None
    graph_label: str | None = None
    new_seqs: int | None = None
    new_tokens: int | None = None
    cached_tokens: int | None = None
    pending_tokens: int | None = None
    input_throughput: float | None = None
    extras: dict[str, Value] = field(default_factory=dict)

    @property
    def dp(self) -> int | None:
        """The DP rank: what tells ranks apart (several TP ranks of one DP group are one)."""
        return self.ranks.get("DP")

    def seconds(self) -> float | None:
        return timestamp_seconds(self.timestamp)


def _value(text: str) -> Value | None:
    text = text.strip()
    if text in ("True", "False"):
        return text == "True"
    text = text.removesuffix("%")
    if _INT.fullmatch(text):
        return int(text)
    try:
        return float(text)
    except ValueError:
        return None


def parse_batch_line(line: str) -> BatchRecord | None:
    """The batch record in a log line, wherever it starts in the line; None if there is none."""
    m = _HEAD.search(line)
    if m is None:
        return None
    kind = "decode" if m.group("kind") == "Decode" else "prefill"
    timestamp, ranks = _prefix(m.group("prefix"))
    rec = BatchRecord(kind, timestamp, ranks)
    if m.group("iter") is not None:
        rec.extras["iteration"] = int(m.group("iter"))
    for item in line[m.end():].split(", "):
        key, sep, raw = item.partition(": ")
        if not sep:
            continue
        key = key.strip()
        value = _value(raw)
        if value is None:
            continue
        name = _FIELDS.get(key)
        if name is not None and not isinstance(value, bool):
            setattr(rec, name, int(value) if name in _INT_FIELDS else float(value))
        elif _GRAPH.fullmatch(key) and isinstance(value, bool):
            rec.graph, rec.graph_label = value, key
        elif key in _EXTRAS and not isinstance(value, bool):
            rec.extras[_EXTRAS[key]] = value
    return rec


def _prefix(prefix: str | None) -> tuple[str | None, dict[str, int]]:
    """`2025-05-31 18:31:21 DP0 TP0` -> ("2025-05-31 18:31:21", {"DP": 0, "TP": 0})."""
    if prefix is None:
        return None, {}
    ranks: dict[str, int] = {}
    words = []
    for word in prefix.split():
        tag = _TAG.fullmatch(word)
        if tag is not None:
            ranks[tag.group(1)] = int(tag.group(2))
        else:
            words.append(word)
    return (" ".join(words) or None), ranks


@dataclass(slots=True)
class Retraction:
    """One retraction line: `retracted` running requests went back to the queue."""

    timestamp: str | None
    ranks: dict[str, int]
    retracted: int

    def seconds(self) -> float | None:
        return timestamp_seconds(self.timestamp)


def parse_retraction(line: str) -> Retraction | None:
    """The retraction record in a log line, wherever it starts; None if there is none."""
    if "#retracted_reqs" not in line:
        return None
    m = _RETRACT.search(line)
    if m is None:
        return None
    timestamp, ranks = _prefix(m.group("prefix"))
    return Retraction(timestamp, ranks, int(m.group("n")))


def timestamp_seconds(stamp: str | None) -> float | None:
    """Seconds for ordering log stamps (`%Y-%m-%d %H:%M:%S[.ms]`, or `%H:%M:%S` up to 0.3.3)."""
    if not stamp:
        return None
    for fmt in ("%Y-%m-%d %H:%M:%S.%f", "%Y-%m-%d %H:%M:%S", "%H:%M:%S"):
        try:
            t = datetime.strptime(stamp, fmt)
        except ValueError:
            continue
        if fmt == "%H:%M:%S":
            return float(t.hour * 3600 + t.minute * 60 + t.second)
        return t.timestamp()
    return None


# ----- one figure per server from per-rank lines ------------------------------------------

@dataclass(slots=True)
class Combined:
    """The server's figures from the newest line of each rank (see `combine`)."""

    ranks_seen: int = 0
    running_reqs: int | None = None
    queued_reqs: int | None = None
    num_tokens: int | None = None
    gen_throughput: float | None = None
    token_usage_mean: float | None = None
    token_usage_max: float | None = None
    accept_length_log: float | None = None
    accept_rate: float | None = None
    graph: bool | None = None
    new_tokens: int | None = None
    prealloc_reqs: int | None = None
    transfer_reqs: int | None = None
    retracted_reqs: int | None = None


def _sum_int(values: list[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _extra_sum(records: list[BatchRecord], key: str) -> int | None:
    known = [int(r.extras[key]) for r in records if key in r.extras]
    return sum(known) if known else None


def combine(records: list[BatchRecord]) -> Combined:
    """One figure per server from one record per rank.

    Requests, queue, tokens and throughput add up across ranks. KV usage does not: each DP
    rank has its own pool of the same size, so the server's usage is their mean (and the
    fullest rank's, max). Accept length is accepted tokens over verify passes: a rank's line
    gives tokens/s (throughput) and tokens per pass (accept len), so its passes/s are
    throughput/accept len and the server's accept length is Σthr / Σ(thr/acc). A rank with
    no accept len or no throughput adds nothing to it; accept rate is weighted by the same
    passes (every rank proposes the same drafts per pass)."""
    out = Combined(ranks_seen=len(records))
    if not records:
        return out
    out.running_reqs = _sum_int([r.running_reqs for r in records])
    out.queued_reqs = _sum_int([r.queued_reqs for r in records])
    out.num_tokens = _sum_int([r.num_tokens for r in records])
    out.new_tokens = _sum_int([r.new_tokens for r in records])
    thr = [r.gen_throughput for r in records if r.gen_throughput is not None]
    out.gen_throughput = sum(thr) if thr else None
    usage = [r.token_usage for r in records if r.token_usage is not None]
    if usage:
        out.token_usage_mean = sum(usage) / len(usage)
        out.token_usage_max = max(usage)
    tokens = passes = rate_num = rate_den = 0.0
    for r in records:
        if r.accept_length_log and r.gen_throughput:
            p = r.gen_throughput / r.accept_length_log
            tokens += r.gen_throughput
            passes += p
            if r.accept_rate is not None:
                rate_num += r.accept_rate * p
                rate_den += p
    out.accept_length_log = tokens / passes if passes else None
    out.accept_rate = rate_num / rate_den if rate_den else None
    graphs = [r.graph for r in records if r.graph is not None]
    out.graph = all(graphs) if graphs else None
    out.prealloc_reqs = _extra_sum(records, "prealloc_reqs")
    out.transfer_reqs = _extra_sum(records, "transfer_reqs")
    out.retracted_reqs = _extra_sum(records, "retracted_reqs")
    return out


def current(newest: dict[int | None, BatchRecord], stale_s: float) -> list[BatchRecord]:
    """The ranks' newest records that still describe the server: a rank whose newest line is
    more than stale_s older than the newest of all has stopped decoding (SGLang logs a rank
    only while it decodes) and its last line no longer holds. Unstamped lines all count."""
    records = list(newest.values())
    stamps = [s for s in (r.seconds() for r in records) if s is not None]
    if not stamps:
        return records
    last = max(stamps)
    return [r for r in records if (s := r.seconds()) is None or last - s <= stale_s]


# ----- start-up facts ---------------------------------------------------------------------

@dataclass(slots=True)
class Startup:
    """What a server says once while starting (`line`s count `\\n` only)."""

    capacity_line: int | None = None
    capacity: dict[str, float] = field(default_factory=dict)  # max_total_num_tokens=... etc.
    uvicorn_line: int | None = None
    uvicorn_url: str | None = None
    ready_line: int | None = None

    @property
    def ready(self) -> bool:
        return self.ready_line is not None

    @property
    def max_running_requests(self) -> int | None:
        """The server-wide running cap it settled on (printed by DP0 only, for all ranks)."""
        value = self.capacity.get("max_running_requests")
        return int(value) if value is not None else None


def _capacity(line: str) -> dict[str, float]:
    m = _CAPACITY.search(line)
    if m is None:
        return {}
    out: dict[str, float] = {}
    for key, raw in _PAIR.findall(line[m.start():]):
        value = _value(raw)
        if isinstance(value, int | float) and not isinstance(value, bool):
            # `available_gpu_mem=78.2 GB`; on a CPU build `available_cpu_mem=18.12 GB`.
            out[key + ("_gb" if key.startswith("available_") and key.endswith("_mem")
                       else "")] = value
    return out


# ----- the reader -------------------------------------------------------------------------

class LogReader:
    """Reads a server log line by line and keeps what the figures need: each rank's newest
    decode and prefill record and the start-up facts. A launch marker starts over."""

    def __init__(self, stale_s: float = 60.0) -> None:
        self.stale_s = stale_s
        self.lines = 0
        self.records: list[BatchRecord] = []  # every record since the launch, when keep_all
        self.keep_all = False
        self.decode: dict[int | None, BatchRecord] = {}
        self.prefill: dict[int | None, BatchRecord] = {}
        self.startup = Startup()
        self.record_lines: list[int] = []
        self.launches = 0  # launch markers read: what follows the last is the process now
        # Requests retracted in the lines read since the launch (or since the tail began):
        # a counter the way SGLang's own is, counted once per DP rank (every TP rank of a
        # group logs the same retraction; the line of TP0, or of an untagged rank, counts).
        self.retracted = 0
        self.last_retraction: Retraction | None = None

    def reset(self) -> None:
        self.decode.clear()
        self.prefill.clear()
        self.startup = Startup()
        self.records.clear()
        self.record_lines.clear()
        self.retracted = 0
        self.last_retraction = None

    def feed_line(self, line: str) -> None:
        self.lines += 1
        if line.startswith(LAUNCH_MARKER):
            self.reset()
            self.launches += 1
            return
        rec = parse_batch_line(line)
        if rec is not None:
            (self.decode if rec.kind == "decode" else self.prefill)[rec.dp] = rec
            if self.keep_all:
                self.records.append(rec)
                self.record_lines.append(self.lines)
            return
        retraction = parse_retraction(line)
        if retraction is not None:
            if retraction.ranks.get("TP", 0) == 0:
                self.retracted += retraction.retracted
                self.last_retraction = retraction
            return
        st = self.startup
        if READY in line:
            st.ready_line = self.lines
        elif st.capacity_line is None and (cap := _capacity(line)):
            st.capacity_line, st.capacity = self.lines, cap
        elif st.uvicorn_line is None and (m := _UVICORN.search(line)):
            st.uvicorn_line, st.uvicorn_url = self.lines, m.group(1)

    def feed_text(self, text: str) -> None:
        """Whole lines, split on `\\n` only (tqdm bars hold bare `\\r`)."""
        for line in text.split("\n"):
            self.feed_line(line)

    def combined(self) -> Combined | None:
        """The server from its decode lines, or, before any, from its prefill lines (which
        carry requests, queue and KV usage but no generation figures); None without either."""
        newest = self.decode or self.prefill
        if not newest:
            return None
        return combine(current(newest, self.stale_s))


class LogTail:
    """Follows a growing log file from where it last read (1 MiB back at first), feeding a
    LogReader; a file that shrank was replaced, and is read again from its start."""

    def __init__(self, path: Path, reader: LogReader | None = None,
                 first_tail_bytes: int = 1 << 20, max_read_bytes: int = 16 << 20) -> None:
        self.path = path
        self.reader = reader or LogReader()
        self.first_tail_bytes = first_tail_bytes
        self.max_read_bytes = max_read_bytes
        self.offset: int | None = None
        self._partial = b""
        self.read_at: float | None = None

    def poll(self) -> LogReader:
        try:
            with open(self.path, "rb") as f:
                size = f.seek(0, 2)
                skip_first = False
                if self.offset is None or size < self.offset:
                    if self.offset is not None:
                        self.reader.reset()
                    self.offset = max(0, size - self.first_tail_bytes)
                    skip_first = self.offset > 0  # it starts mid-line
                    self._partial = b""
                if size - self.offset > self.max_read_bytes:
                    # Far behind (a flood of access-log lines): only the newest part matters.
                    self.offset = size - self.max_read_bytes
                    skip_first, self._partial = True, b""
                f.seek(self.offset)
                data = f.read(size - self.offset)
        except FileNotFoundError:
            return self.reader
        self.offset += len(data)
        self.read_at = time.time()
        chunk = self._partial + data
        lines = chunk.split(b"\n")
        self._partial = lines.pop()
        if skip_first and lines:
            lines.pop(0)
        for raw in lines:
            self.reader.feed_line(raw.decode(errors="replace"))
        return self.reader


def read_log(path: Path) -> LogReader:
    """A whole log read at once, every record kept (for tests and one-off reads)."""
    reader = LogReader()
    reader.keep_all = True
    reader.feed_text(path.read_bytes().decode(errors="replace"))
    return reader
