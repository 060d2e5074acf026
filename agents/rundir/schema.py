"""Every file format and message of a run, defined once (msgspec Structs, versioned).

The console imports this module; it must stay free of I/O and of heavy imports.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from agents.rundir.gpugroups import MAX_GROUP

SCHEMA_VERSION = 1

RunStatus = Literal["starting", "running", "paused", "draining", "done", "failed", "stopped"]
ServerState = Literal["starting", "healthy", "degraded", "down", "restarting"]
FinishReason = Literal["stop", "length", "tool_calls", "abort", "content_filter", "function_call"]


class Usage(msgspec.Struct, omit_defaults=False):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int = 0


class BatchLine(msgspec.Struct, omit_defaults=False):
    """One completion in a batch file. Readers take the highest `attempt` per index."""

    index: int
    messages: list[dict[str, Any]]
    finish_reason: str
    usage: Usage
    v: int = SCHEMA_VERSION
    id: str | None = None
    tools: list[dict[str, Any]] | None = None
    reasoning_content: str | None = None
    content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    model: str | None = None
    sampling: dict[str, Any] = msgspec.field(default_factory=dict)
    chat_template_kwargs: dict[str, Any] = msgspec.field(default_factory=dict)
    max_tokens: int = 0
    server: int | None = None
    latency_s: float | None = None
    spec_verify_ct: int | None = None
    attempt: int = 1
    # The answer came from a hedge (a second copy sent at the tail), not the first copy: the
    # dataset card compares such lines' lengths with the rest's.
    hedged: bool = False


class LineKey(msgspec.Struct):
    """The two fields recovery needs from a batch line, decoded without the rest."""

    index: int
    attempt: int = 1


class FailureEvent(msgspec.Struct, omit_defaults=True):
    """A line of failures.jsonl, the engine's journal of everything that is not a completion.

    event "failed": an index gave up after its attempts; "requeued": an index is to be generated
    again (retry failed / truncated) at generation `attempt`; "retry": a retry request applied.
    An index's state in this file is its last event.
    """

    event: Literal["failed", "requeued", "retry"]
    time: float
    index: int | None = None
    error: str | None = None
    message: str | None = None
    attempts: int | None = None
    server: int | None = None
    attempt: int | None = None
    line: int | None = None
    what: str | None = None
    rev: int | None = None


class UploadRecord(msgspec.Struct):
    """A line of uploads.jsonl: one closed batch, confirmed in S3 by a HEAD.

    `checksum` says how: "sha256" when the object carries an S3 SHA-256 checksum (checked by
    S3 at the put) equal to `sha256`, the one proof that holds under SSE-KMS, whose ETag is
    not the MD5; None (lines from before checksums, or an S3 that keeps none) when its ETag
    equals the MD5 of the bytes."""

    batch: str
    size: int
    sha256: str
    key: str
    etag: str
    bucket: str
    uploaded_at: float
    checksum: Literal["sha256"] | None = None


class Concurrency(msgspec.Struct):
    """Requests in flight per server: `default`, or `servers[N]`. A server is auto-tuned when
    `auto_servers[N]` says so, else when `auto` does (`resize auto`); the tuner then writes
    its level into `servers[N]`, and a manual resize of N sets `auto_servers[N]` false."""

    default: int
    servers: dict[str, int] = msgspec.field(default_factory=dict)
    auto: bool = False
    auto_servers: dict[str, bool] = msgspec.field(default_factory=dict)

    def for_server(self, server: int) -> int:
        return self.servers.get(str(server), self.default)

    def auto_for(self, server: int) -> bool:
        return self.auto_servers.get(str(server), self.auto)


class RetryRequests(msgspec.Struct):
    """Monotonic request counters: the engine applies each increase once."""

    failed: int = 0
    truncated: int = 0
    # `retry truncated --long-only`: the truncated indices whose line is not a loop.
    long: int = 0


class Control(msgspec.Struct, forbid_unknown_fields=True):
    """control.json: the desired live settings, written under the control lock, rev increasing."""

    rev: int
    concurrency: Concurrency
    max_tokens: int
    paused: bool = False
    retry: RetryRequests = msgspec.field(default_factory=RetryRequests)


class TunePoint(msgspec.Struct):
    """One measurement of a server at a concurrency: output tokens/s and the mean latency of
    the requests that ran entirely at that level (`at`: when it was taken)."""

    concurrency: int
    tok_per_s: float
    latency_s: float
    requests: int
    at: float


TunePhase = Literal["measuring", "settled", "waiting"]


class AutoTune(msgspec.Struct):
    """The auto-tuner's state for one server: the level it chose, what it is doing, the
    ceiling the server reported (`max_running_requests`), and the curve it measured."""

    level: int
    phase: TunePhase
    cap: int | None = None
    best: int | None = None
    curve: list[TunePoint] = msgspec.field(default_factory=list)
    next_probe_at: float | None = None
    note: str | None = None  # the last decision, in words


class ServerProgress(msgspec.Struct):
    url: str
    state: ServerState
    in_flight: int
    limit: int
    completed: int
    failed: int
    req_per_s: float
    tok_per_s: float
    accept_length: float | None
    errors_in_row: int = 0
    last_error: str | None = None
    autotune: AutoTune | None = None  # None: the server's concurrency is set by hand


class Progress(msgspec.Struct):
    """progress.json: the engine's heartbeat. Keys of the reference run, then ours."""

    total: int
    completed: int
    failed: int
    rate_per_sec: float
    eta_hours: float | None
    total_input_tokens: int
    total_output_tokens: int
    avg_output_tokens: float
    elapsed_hours: float
    s3_uploaded: int
    s3_bytes: int
    status: RunStatus
    truncated: int
    empty: int
    max_tokens: int
    concurrency: int
    in_flight: int
    retried: int
    s3_pending: int
    control_rev: int
    updated_at: float
    servers: dict[str, ServerProgress]
    v: int = SCHEMA_VERSION
    kind: Literal["generate"] = "generate"
    run: str = ""
    pid: int | None = None
    started_at: float | None = None
    total_reasoning_tokens: int = 0
    bad_input: int = 0
    paused: bool = False
    s3_error: str | None = None
    batches_closed: int = 0
    message: str | None = None
    # The tail: the work left is under the capacity in flight, so idle servers take second
    # copies of the oldest requests (hedges). Hedges sent and won, and requests given up at
    # their deadline, count since this engine started; of those misses, the ones the server
    # confirmed it aborted (it answered finish_reason abort to our /abort_request); and
    # answers that came past their deadline while the abort was on the way (kept, not misses).
    tail: bool = False
    hedges: int = 0
    hedges_won: int = 0
    deadline_misses: int = 0
    aborts_confirmed: int = 0
    late_answers: int = 0
    # "Later" answers (a full queue: SGLang's 503 past --max-queued-requests, a 429): sent
    # again after a pause, not counted as a try.
    busy_answers: int = 0
    # The engine's event loop: its worst stall (ms late past a 100 ms sleep) over the last
    # minute and since it started. Everything the engine does waits behind a stall.
    loop_lag_ms: float = 0.0
    loop_lag_max_ms: float = 0.0
    # The worst stall's tick: the loop thread's CPU and its wait for a CPU (a shared box's
    # share); and the worst stall less that wait, the engine's own (agents/engine/looplag.py).
    loop_lag_max_cpu_ms: float = 0.0
    loop_lag_max_wait_ms: float = 0.0
    loop_lag_own_max_ms: float = 0.0
    # The ETA's p10-p90 band, from the spread of the recent rate (None until it is known).
    eta_p10_hours: float | None = None
    eta_p90_hours: float | None = None
    # What it costs: GPUs held, GPU-hours so far (across restarts), and with
    # [run] cost_per_gpu_hour the money (None without it).
    gpus: int = 0
    gpu_hours: float = 0.0
    cost: Cost | None = None
    # Answers written and those cut at max_tokens, per the max_tokens each ran with (keys
    # are the limit as text): truncation is judged against the limit an answer ran with.
    answers_by_limit: dict[str, int] = msgspec.field(default_factory=dict)
    truncated_by_limit: dict[str, int] = msgspec.field(default_factory=dict)
    # Of `truncated`, the answers that ended in a repetition loop (agents/engine/loops.py):
    # more max_tokens buys more of the same; the rest are long answers worth a retry.
    truncated_loops: int = 0
    # The campaign this node's run belongs to ([run] campaign).
    campaign: str | None = None
    # A campaign node (a [queue] run): the campaign's chunks as this node last listed them,
    # what it holds and committed; `total` is then what it did and holds.
    queue: QueueProgress | None = None


class QueueProgress(msgspec.Struct):
    """A campaign node's view of the queue. The node's own figures (Progress.completed,
    failed, truncated) are its run's lines, lines no commit names included; the `lines_*`
    are the campaign's as the commit objects this node has read define them (each index
    once, from its highest committing generation), `*_here` the part of those whose commit
    is this node's. None: an agent from before the commits were counted."""

    node: str
    run_id: str
    generation: int = 0
    chunks: int = 0
    committed: int = 0
    committed_here: int = 0
    lost: int = 0  # commits refused: another node committed the chunk first
    held: list[str] = msgspec.field(default_factory=list)
    backups: int = 0
    taken_over: int = 0
    to_do_here: int = 0
    finished: bool = False
    prompts_lines: int = 0  # the campaign's
    chunk_size: int = 0
    s3_error: str | None = None
    commits_counted: int | None = None  # commit objects read, of every generation
    lines_done: int | None = None  # truncated ones included
    lines_failed: int | None = None
    lines_truncated: int | None = None
    done_here: int | None = None
    failed_here: int | None = None
    truncated_here: int | None = None
    lost_lines: int | None = None  # written here, named by no commit (refused, dropped)


class Cost(msgspec.Struct):
    """Money: `usd` so far, per million output tokens, and projected to the end at the ETA."""

    per_gpu_hour: float
    usd: float
    per_mtok_usd: float | None
    projected_usd: float | None


def cost_of(per_gpu_hour: float | None, gpus: int, gpu_hours: float, output_tokens: int,
            eta_hours: float | None) -> Cost | None:
    """The run's cost at a price; the console calls it again with a node's own price."""
    if per_gpu_hour is None:
        return None
    usd = per_gpu_hour * gpu_hours
    return Cost(
        per_gpu_hour=per_gpu_hour, usd=round(usd, 2),
        per_mtok_usd=round(usd / (output_tokens / 1e6), 3) if output_tokens else None,
        projected_usd=(round(usd + per_gpu_hour * gpus * eta_hours, 2)
                       if eta_hours is not None else None),
    )


class RunPin(msgspec.Struct):
    """run.pin.json: what the indices mean. A resume against anything else is refused."""

    prompts_path: str
    prompts_sha256: str
    prompts_lines: int
    prompts_size: int
    prompts_mtime_ns: int
    model: str
    sampling: dict[str, Any]
    chat_template_kwargs: dict[str, Any]
    created_at: float


class TrainProgress(msgspec.Struct):
    """progress.json of a training run (kind = "train"): the trainer's heartbeat, atomic.

    `accuracy[k-1]` is the held-in accuracy at block position k (1..block_size-1) over the
    recent steps; `accept_length` estimates DFlash's tau as 1 + the leading correct positions
    per block, averaged. `heldout_accept_length` is the same on held-out data, measured at
    each checkpoint; the best checkpoint is the one where it was highest.
    """

    step: int
    total_steps: int
    epoch: int
    loss: float | None
    accuracy: list[float]
    accept_length: float | None
    tokens_per_s: float
    lr: float
    eta_hours: float | None
    last_checkpoint: str | None
    best_checkpoint: str | None
    status: RunStatus
    updated_at: float
    v: int = SCHEMA_VERSION
    kind: Literal["train"] = "train"
    run: str = ""
    pid: int | None = None
    started_at: float | None = None
    elapsed_hours: float = 0.0
    epochs: int = 0
    steps_per_s: float = 0.0
    world_size: int = 1
    heldout_accept_length: float | None = None
    best_accept_length: float | None = None
    message: str | None = None
    # Training across nodes ([train] nodes): this node's rank; rank 0's file is the run's
    # progress, the others count the same steps and say "rank R of N, following rank 0".
    node_rank: int = 0
    nodes: int = 1


encoder = msgspec.json.Encoder()
line_key_decoder = msgspec.json.Decoder(LineKey)
batch_line_decoder = msgspec.json.Decoder(BatchLine)
failure_decoder = msgspec.json.Decoder(FailureEvent)
upload_decoder = msgspec.json.Decoder(UploadRecord)
progress_decoder = msgspec.json.Decoder(Progress)
control_decoder = msgspec.json.Decoder(Control)
pin_decoder = msgspec.json.Decoder(RunPin)
train_progress_decoder = msgspec.json.Decoder(TrainProgress)


# -- the status snapshot: what an agent tells a console (one schema for RPC and --json) --------

AlertSeverity = Literal["warning", "critical"]


class Alert(msgspec.Struct):
    code: str
    severity: AlertSeverity
    message: str
    since: float
    server: int | None = None
    # Console actions (ids of console/actions.py) that deal with it; the console names the
    # user's keys for them.
    actions: list[str] = msgspec.field(default_factory=list)
    # The node posted it to [alerts] webhook itself (agents/supervise/pager.py took it): the
    # console does not page it again.
    paged: bool = False


class PagerStatus(msgspec.Struct):
    """The node's own pager ([alerts] webhook): what it posted, what waits, what it lost.
    Never the URL (a secret)."""

    format: str
    posted: int = 0  # posts the receiver took (a summary post counts once)
    pages: int = 0  # alerts and clearings those posts carried
    pending: int = 0  # waiting: the receiver is down, or the rate limit holds them
    dropped: int = 0  # lost: the queue was full, or the receiver refused them for good
    failures: int = 0  # failed tries (each retried, with backoff)
    last_error: str | None = None
    last_error_at: float | None = None
    last_posted_at: float | None = None


class GpuStats(msgspec.Struct):
    """NVML figures; every field None when NVML is absent (never zeros)."""

    util_pct: float | None = None
    mem_used_mib: float | None = None
    mem_total_mib: float | None = None
    temp_c: float | None = None
    power_w: float | None = None


# A server's GPUs as a node may send them: ids 0 or more, at most MAX_GROUP, at least one.
GpuGroup = Annotated[list[Annotated[int, msgspec.Meta(ge=0)]],
                     msgspec.Meta(min_length=1, max_length=MAX_GROUP)]
# A count a node sends (requests, tokens): never negative.
Count = Annotated[int, msgspec.Meta(ge=0)]


# Why a server's process exited, as agents/supervise/crashcause.py reads it from its log: the
# kinds it sends and what each is called. A newer agent may send a kind not listed here.
EXIT_CAUSES: dict[str, str] = {
    "out_of_memory": "out of memory", "unknown_argument": "unknown argument",
    "bad_argument": "bad argument", "missing_model": "missing model",
    "model_unreachable": "model unreachable", "port_in_use": "port in use",
    "exception": "exception"}


class ServerStatus(msgspec.Struct):
    number: int
    url: str
    state: ServerState
    gpu: int | None = None  # the first of `gpus` (kept for snapshots from before groups)
    # Every GPU the server spans, in its device order (CUDA_VISIBLE_DEVICES); None for a
    # server started elsewhere and in snapshots from before groups (then `gpu` alone).
    gpus: GpuGroup | None = None
    port: int | None = None
    pid: int | None = None
    restarts: int = 0
    started_at: float | None = None
    in_flight: int = 0
    limit: int = 0
    completed: int = 0
    failed: int = 0
    req_per_s: float = 0.0
    tok_per_s: float = 0.0
    running_reqs: int | None = None
    queued_reqs: int | None = None
    gen_throughput: float | None = None
    token_usage: float | None = None
    effective_max_running: int | None = None
    # The KV pool (every DP rank's together) and the tokens running requests hold in it;
    # requests SGLang retracted (sent back to its queue when decoding ran out of KV room):
    # its own counter since it started, and those the supervisor saw in the last [alerts]
    # window_s (from that counter or the log's retraction lines). None: not known.
    kv_capacity_tokens: Count | None = None
    kv_used_tokens: Count | None = None
    retracted_total: Count | None = None
    retracted_recent: Count | None = None
    accept_length: float | None = None  # the engine's, from per-request spec details
    accept_length_cum: float | None = None  # /server_info avg_spec_accept_length
    accept_length_window: float | None = None  # /metrics sglang:spec_accept_length
    accept_length_log: float | None = None  # the decode log line, a fallback
    last_error: str | None = None
    # Why its process last exited (an EXIT_CAUSES key), until it is healthy again; the log
    # line that says so is in last_error. restarts_stopped: why the supervisor stopped restarting
    # it (the same deterministic cause twice in a row at start-up); restart-server clears it.
    exit_cause: str | None = None
    restarts_stopped: str | None = None
    health_checked_at: float | None = None
    metrics_at: float | None = None
    # NVML figures of the server's GPUs together: memory and power summed, utilisation the
    # mean, temperature the hottest (agents/supervise/snapshot.py Nvml.stats).
    gpu_stats: GpuStats | None = None

    @property
    def gpu_group(self) -> list[int] | None:
        """The server's GPUs: `gpus`, or `[gpu]` from a snapshot that has only that."""
        if self.gpus is not None:
            return self.gpus
        return [self.gpu] if self.gpu is not None else None


class DiskStatus(msgspec.Struct):
    path: str
    free_bytes: int
    total_bytes: int
    hours_to_full: float | None = None


class Snapshot(msgspec.Struct):
    """The status snapshot, typed and versioned: numbers are numbers, units in names, None
    for unknown. `source` says whether a live supervisor made it or the run directory alone."""

    kind: Literal["generate", "train"]
    run: str
    run_dir: str
    host: str
    status: str
    updated_at: float
    source: Literal["supervisor", "disk"]
    v: int = SCHEMA_VERSION
    agent_version: str = ""
    supervisor_pid: int | None = None
    progress: Progress | None = None
    progress_age_s: float | None = None
    train: TrainProgress | None = None
    servers: list[ServerStatus] = msgspec.field(default_factory=list)
    alerts: list[Alert] = msgspec.field(default_factory=list)
    disk: DiskStatus | None = None
    message: str | None = None
    pager: PagerStatus | None = None  # None: no [alerts] webhook


snapshot_decoder = msgspec.json.Decoder(Snapshot)


# -- artifacts: the manifest of a run directory and the verify report ---------------------------

ArtifactKind = Literal["batch", "open_batch", "state", "log", "launch", "checkpoint", "other"]
HashSource = Literal["uploads", "cache", "read"]


class ManifestEntry(msgspec.Struct, omit_defaults=False):
    """One file of RUN_DIR. `sha256` is that of the first `size` bytes (a file still being
    appended to grows past them); it is None for a refused entry, which is never served.
    `in_s3`: a closed batch that uploads.jsonl records with this size and hash."""

    path: str  # relative to RUN_DIR, '/'-separated
    kind: ArtifactKind
    size: int
    mtime: float
    mtime_ns: int
    sha256: str | None
    sha256_from: HashSource | None = None
    in_s3: bool = False
    refused: Literal["symlink", "unreadable"] | None = None
    # A name that is not UTF-8 (JSON cannot carry it): its bytes, base64; `path` then shows
    # them escaped (\xff), for reading only. The console decodes the bytes back
    # (surrogateescape), so such a file is pulled under its own name.
    path_b64: str | None = None


class ManifestPage(msgspec.Struct, omit_defaults=False):
    """A page of the manifest, sorted by path; `next_offset` is None on the last page."""

    entries: list[ManifestEntry]
    total: int
    next_offset: int | None


class VerifyCheck(msgspec.Struct, omit_defaults=False):
    name: str
    ok: bool
    detail: str


class VerifyCounts(msgspec.Struct, omit_defaults=False):
    """What verify counted. `None`: not known (no progress.json, no [s3], S3 unreachable)."""

    done_indices: int  # distinct indices in .done_indices
    done_records: int  # its lines (an index retried has one per attempt)
    progress_completed: int | None
    current_lines: int  # distinct indices with a batch line (the highest attempt is current)
    lines: int  # every batch line, superseded ones included
    closed_batches: int
    open_batch_lines: int
    upload_records: int
    s3_objects: int | None
    s3_bytes: int | None


class VerifyReport(msgspec.Struct, omit_defaults=False):
    """`verify`: S3 against uploads.jsonl and the counts against each other. Every problem
    names its batch and, where it has one, its index range."""

    ok: bool
    checks: list[VerifyCheck]
    problems: list[str]
    counted: VerifyCounts
    run_status: str | None = None
    s3_url: str | None = None
    elapsed_s: float = 0.0


# -- the failures view: failures.jsonl grouped by error class ---------------------------------

# What the console accepts from a node's `failures` answer; the agent's summary stays well
# inside (agents/rundir/failsummary.py sets the real caps).
MAX_FAILURE_GROUPS = 64
MAX_GROUP_SERVERS = 16
MAX_GROUP_EXAMPLES = 3
MAX_EXAMPLE_CHARS = 600
BigCount = Annotated[int, msgspec.Meta(ge=0, le=2**53)]
When = Annotated[float, msgspec.Meta(ge=0, le=1e11)]  # seconds since the epoch, finite


class ServerCount(msgspec.Struct, omit_defaults=False):
    server: Annotated[int, msgspec.Meta(ge=0, le=2**31)]
    count: BigCount


class FailureExample(msgspec.Struct, omit_defaults=False):
    """A line of failures.jsonl as written (cut at MAX_EXAMPLE_CHARS), with its line number."""

    line: BigCount
    text: Annotated[str, msgspec.Meta(max_length=MAX_EXAMPLE_CHARS)]


class FailureGroup(msgspec.Struct, omit_defaults=False):
    """The journal's events of one kind and one class: `failed` with an error class
    (`http_503`, `timeout`, `deadline`, `aborted`, `connect`, `transport`, `bad_response`,
    `bad_input`), or `requeued` with its reason (`deadline`, `failed`, `truncated`).
    `servers`: the servers named, most events first (`servers_more` named beyond them);
    `examples`: the first event and the last ones."""

    event: Literal["failed", "requeued"]
    error: Annotated[str, msgspec.Meta(max_length=64)]
    count: BigCount
    first: When
    last: When
    servers: Annotated[list[ServerCount], msgspec.Meta(max_length=MAX_GROUP_SERVERS)]
    servers_more: BigCount = 0
    no_server: BigCount = 0  # events that name no server (bad input, a retry's requeue)
    examples: Annotated[list[FailureExample],
                        msgspec.Meta(max_length=MAX_GROUP_EXAMPLES)] = msgspec.field(
                            default_factory=list)


class FailureSummary(msgspec.Struct, omit_defaults=False):
    """`failures`: failures.jsonl summarised on the node, most events first. Read
    incrementally, a bounded share per call: `complete` is false until a call read to the end
    (ask again to read on); `bytes_read` stops short of `bytes_total` by an unfinished last
    line. `other`: events of classes beyond MAX_FAILURE_GROUPS; `unreadable`: lines
    skipped; `lines`: lines read."""

    groups: Annotated[list[FailureGroup], msgspec.Meta(max_length=MAX_FAILURE_GROUPS)]
    events: BigCount
    retries: BigCount
    other: BigCount
    unreadable: BigCount
    bytes_read: BigCount
    bytes_total: BigCount
    complete: bool
    lines: BigCount = 0
