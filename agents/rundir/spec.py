"""run.toml: the run spec, validated at load with errors that name the file and the key."""

from __future__ import annotations

import re
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import msgspec

from agents.rundir.gpugroups import GpusSpec, gpus_problem, groups
from agents.rundir.sampling import sampling_problem

# Where `concurrency_per_server = "auto"` starts: low, so that a server whose knee is low is
# never flooded while the tuner climbs.
AUTO_START = 4
# Defaults that follow another key when unset: a spec that sets only the other key means
# what it says (a request_timeout_s of 20 s is a 20 s floor, not a refusal over 30).
DEFAULT_CONCURRENCY = 40  # capped by max_concurrency
DEFAULT_MIN_DEADLINE_S = 30.0  # capped by request_timeout_s


class SpecError(ValueError):
    """A run spec that cannot be used; the message names the file, the key and the reason."""


class RunSection(msgspec.Struct, forbid_unknown_fields=True):
    name: str
    kind: Literal["generate", "train"] = "generate"
    dir: str | None = None
    # Dollars per GPU-hour: with it, progress.json carries $ so far, $ per million output
    # tokens and the projected total. GPUs: every GPU of [servers] gpus (a server on a group
    # of two counts two), or one per url.
    cost_per_gpu_hour: float | None = None
    # The campaign this node's run belongs to (set by `fleetdeck launch CAMPAIGN`); shown.
    campaign: str | None = None


class ServersSection(msgspec.Struct, forbid_unknown_fields=True):
    urls: list[str] | None = None
    # urls = [ONE URL] is SGLang's router (sglang-router), not a server: the engine sends to
    # it as one server whose concurrency is the router's as a whole, and the supervisor lists
    # its workers (GET /workers) and watches each one (agents/supervise/router.py).
    router: bool = False
    # One server per entry: a GPU id (gpus = [0, 1]) or a group of GPUs the server spans
    # (gpus = [[0, 1], [2, 3]]: CUDA_VISIBLE_DEVICES="0,1", {tp} = 2). agents/rundir/gpugroups.py.
    gpus: GpusSpec | None = None
    base_port: int = 30000
    model: str | None = None
    command: str | None = None
    env: dict[str, str] = msgspec.field(default_factory=dict)
    startup_timeout_s: float = 1800.0
    # Secrets (see agents/rundir/secrets.py): api_key and admin_api_key, and env values whose
    # name holds TOKEN, KEY, SECRET or PASSWORD or is listed in secret_env. Kept out of every
    # file the run serves or pulls; servers get secret env values in their environment only.
    api_key: str | None = None
    admin_api_key: str | None = None
    secret_env: list[str] = msgspec.field(default_factory=list)
    # Above SGLang's own 20 s health generation timeout: a busy server is slow, not dead.
    health_timeout_s: float = 30.0
    health_interval_s: float = 2.0
    # Failed health checks in a row before a live process is called down.
    health_failures_to_down: int = 3
    # A server down this long while its process lives (hung) is killed and restarted.
    hung_restart_s: float = 300.0
    restart_backoff_s: float = 5.0
    max_restarts: int = 10

    @property
    def groups(self) -> list[list[int]]:
        """The GPUs of each server the supervisor launches, in order (none with urls)."""
        return groups(self.gpus)

    @property
    def gpu_count(self) -> int:
        """Every GPU the launched servers hold."""
        return sum(len(g) for g in self.groups)


class GenerateSection(msgspec.Struct, forbid_unknown_fields=True):
    prompts: str
    model: str | None = None
    max_tokens: int = 4096
    # Requests in flight per server, or "auto": each server's level is tuned from measured
    # throughput and latency (agents/engine/autotune.py).
    # Unset: DEFAULT_CONCURRENCY, or max_concurrency when that is lower.
    concurrency_per_server: int | Literal["auto"] | None = None
    batch_size: int = 500
    retries: int = 3
    request_timeout_s: float = 3600.0
    connect_timeout_s: float = 10.0
    sampling: dict[str, Any] = msgspec.field(default_factory=dict)
    chat_template_kwargs: dict[str, Any] = msgspec.field(default_factory=dict)
    # A server is set aside after this many failures in a row, and probed until it answers.
    server_failures_to_down: int = 3
    drain_timeout_s: float = 300.0
    max_concurrency: int = 1024
    # A prompt line longer than this (bytes, newline not counted) is bad_input, never read
    # whole.
    max_prompt_bytes: int = 16 << 20
    # Request deadlines: a request running past deadline_factor x the time its server's recent
    # pace gives its max_tokens (never under min_deadline_s, never over request_timeout_s) is
    # aborted and sent again elsewhere, against `retries`. 0 turns deadlines off.
    deadline_factor: float = 3.0
    # Unset: DEFAULT_MIN_DEADLINE_S, or request_timeout_s when that is lower (deadline_floor_s).
    min_deadline_s: float | None = None
    # At the tail (work left under the capacity in flight) the oldest requests go a second
    # time to idle servers; the first answer wins, the other is aborted.
    hedge: bool = True

    @property
    def concurrency(self) -> int | Literal["auto"]:
        """concurrency_per_server as meant: the one written, else the default under the cap."""
        if self.concurrency_per_server is None:
            return min(DEFAULT_CONCURRENCY, self.max_concurrency)
        return self.concurrency_per_server

    @property
    def auto_concurrency(self) -> bool:
        return self.concurrency == "auto"

    @property
    def initial_concurrency(self) -> int:
        """The level a run starts at: the number given, or the auto-tuner's first probe."""
        level = self.concurrency
        if isinstance(level, int):
            return level
        return min(AUTO_START, self.max_concurrency)

    @property
    def deadline_floor_s(self) -> float:
        """min_deadline_s as meant: the one written, else the default under request_timeout_s."""
        if self.min_deadline_s is None:
            return min(DEFAULT_MIN_DEADLINE_S, self.request_timeout_s)
        return self.min_deadline_s


class AlertsSection(msgspec.Struct, forbid_unknown_fields=True):
    """Alert thresholds; rates are judged over the last `window_s` seconds."""

    window_s: float = 300.0
    stall_minutes: float = 10.0
    failure_rate: float = 0.05
    truncation_rate: float = 0.10
    empty_rate: float = 0.05
    # A server's accept length under this share of its own level over the run's first
    # accept_baseline_hours (from the history: a restart keeps it), or of the run's average.
    accept_drop: float = 0.7
    # The fleet's mean over the last accept_recent_minutes under this share of its mean over
    # the run's first accept_baseline_hours: accept_drift (0: off).
    accept_fleet_drop: float = 0.7
    accept_recent_minutes: float = 20.0
    accept_baseline_hours: float = 2.0
    disk_hours: float = 6.0
    min_samples: int = 20
    # A run done or stopped while its servers still hold the GPUs this long: "GPUs idle".
    idle_alert_s: float = 900.0
    # KV pressure on a server (kv_pressure:N): this many requests retracted in the window
    # (0: never on retractions), or its queue growing while it runs under its cap with token
    # usage at least kv_usage (SGLang keeps room for running requests to grow, so a pool
    # that admits nothing more can show 0.7-0.8).
    kv_retractions: int = 1
    kv_usage: float = 0.7
    # Pages from the node (agents/supervise/pager.py): each new alert and its clearing is
    # posted here by the supervisor itself. A secret (agents/rundir/secrets.py): kept out of
    # the run.toml copy, status, logs and the pull set.
    webhook: str | None = None
    webhook_format: Literal["slack", "ntfy"] = "slack"
    # At most this many posts a minute; the rest wait and go as one summary post.
    webhook_per_minute: int = 6
    # Pages kept while the receiver is down; past this the oldest are dropped (counted in
    # status: pager.dropped).
    webhook_queue: int = 200
    # The node_exporter textfile (a *.prom path; agents/supervise/textfile.py).
    prometheus_textfile: str | None = None


class S3Section(msgspec.Struct, forbid_unknown_fields=True):
    bucket: str
    prefix: str = ""
    endpoint_url: str | None = None
    profile: str | None = None
    region: str | None = None


class QueueSection(msgspec.Struct, forbid_unknown_fields=True):
    """A campaign node: its work leased chunk by chunk from the campaign's S3 prefix
    (agents/queue). `fleetdeck launch CAMPAIGN` sets `node`."""

    node: str
    chunk_size: int = 1000
    lease_s: float = 1200.0
    # A lease is judged expired this long after its term (on the store's clock): margin for
    # a holder whose renewal is slow to land. Default: a tenth of the term, at most 60 s.
    skew_s: float | None = None
    # An idle node backs up a running chunk older than this many times the median chunk time.
    backup_after: float = 2.0
    # How often a node with nothing to claim looks at the queue again (at most lease_s / 4).
    poll_s: float = 30.0

    @property
    def skew(self) -> float:
        return self.skew_s if self.skew_s is not None else min(60.0, self.lease_s / 10)

    @property
    def poll(self) -> float:
        return min(self.poll_s, self.lease_s / 4)


# The paper's and SpecForge's sequence length, [train] max_length's default.
DEFAULT_MAX_LENGTH = 3072


class TrainSection(msgspec.Struct, forbid_unknown_fields=True):
    """[train]: a DFlash drafter trained on completion batches (see docs/trainer.md).

    `data`, `target` and `tokenizer` are relative to the spec's folder; `prepared` and `output`
    to the run directory.
    """

    # Completion batches: a local folder or s3://bucket/prefix (read through boto3).
    data: str
    # The target model, a Hugging Face folder; its tokenizer unless `tokenizer` is set.
    target: str
    tokenizer: str | None = None
    endpoint_url: str | None = None
    prepared: str = "prepared"
    output: str = "checkpoints"
    # Data preparation: which assistant turns carry loss, and the quality gate.
    supervise: Literal["final", "all"] = "final"
    keep_truncated: bool = False
    # Tokens per sample (None: DEFAULT_MAX_LENGTH, and the gate refuses a set where more than
    # max_cut_share of the samples would lose their ending to it; set explicitly, it does not).
    max_length: int | None = None
    max_cut_share: float = 0.05
    max_under_min_share: float = 0.2
    heldout_share: float = 0.01
    # The drafter.
    block_size: int = 16
    drafter_layers: int = 5
    target_features: int = 5
    target_layer_ids: list[int] | None = None
    mask_token_id: int | None = None
    # Optimisation (the DFlash paper's recipe by default).
    epochs: int = 6
    lr: float = 6e-4
    warmup_ratio: float = 0.04
    batch_size: int = 4
    grad_accum: int = 1
    anchors: int = 512
    # Labelled positions per chunk of the LM head in the loss (its logits are never whole).
    loss_chunk: int = 1024
    # Where an anchor may sit: on any supervised token whose next token is supervised too
    # (SpecForge's rule; the block's part past the answer's end carries no loss), or only
    # where a whole block fits ("whole_block", the old rule).
    anchor_rule: Literal["supervised_next", "whole_block"] = "supervised_next"
    gamma: float | None = None
    clip: float = 1.0
    weight_decay: float = 0.0
    max_steps: int | None = None
    save_every: int = 1000
    eval_samples: int = 256
    keep_last: int = 2
    seed: int = 0
    dtype: Literal["auto", "bfloat16", "float32"] = "auto"
    nproc: int = 1
    # GiB of memory per GPU for the memory plan (None: the device's own; on the CPU, none).
    gpu_mem_gib: float | None = None
    # Train even where the memory plan says the run does not fit (`train --allow-unfit`).
    allow_unfit: bool = False
    # The drafter's weights, gradients and AdamW state across processes: replicated (DDP,
    # "never"), sharded (FSDP2, "always"), or sharded where replicating would crowd a GPU
    # ("auto", trainer/sharding.py).
    shard: Literal["auto", "always", "never"] = "auto"
    # Steps (of each invocation) whose collectives wait join_timeout_s, not node_timeout_s
    # (across nodes): the first compiles of flex attention.
    startup_steps: int = 3
    # Across nodes: `nodes` machines of `nproc` processes each, joined by torchrun's c10d
    # rendezvous at rdzv_endpoint ("HOST:PORT" of node rank 0, which hosts it, writes the
    # checkpoints and the run's progress). node_rank is set per node by the launch (in a
    # training campaign: the node's place in the campaign's list).
    nodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: str | None = None
    # A node silent this long (no heartbeat, a collective waiting after startup_steps but
    # for a step that compiles a new shape) is lost: the job stops and `resume` continues
    # from the last checkpoint. One node's collectives always wait join_timeout_s.
    node_timeout_s: float = 30.0
    # How long the processes wait for each other to start (prepare, loading the target, the
    # first steps' compiles) and for rank 0 to write a checkpoint.
    join_timeout_s: float = 1800.0
    # Evaluation by real speculative decoding.
    eval_prompts: int = 64
    eval_max_new_tokens: int = 256


class RunSpec(msgspec.Struct, forbid_unknown_fields=True):
    run: RunSection
    servers: ServersSection = msgspec.field(default_factory=ServersSection)
    generate: GenerateSection | None = None
    s3: S3Section | None = None
    alerts: AlertsSection = msgspec.field(default_factory=AlertsSection)
    train: TrainSection | None = None
    queue: QueueSection | None = None
    # Where the file was read from; relative paths in it are relative to its folder.
    source: str = ""

    # Folder that relative paths are relative to (the original run.toml's, also for the copy
    # kept in RUN_DIR).
    base: str = ""
    # Keys a launch set over the file's ({"queue": {"node": "gpu-3"}}): kept in RUN_DIR's
    # copy, so a resume runs what was launched.
    launched_with: dict[str, dict[str, Any]] = msgspec.field(default_factory=dict)

    @property
    def base_dir(self) -> Path:
        if self.base:
            return Path(self.base)
        return Path(self.source).resolve().parent if self.source else Path.cwd()

    @property
    def run_dir(self) -> Path:
        if self.run.dir:
            path = Path(self.run.dir)
            return path if path.is_absolute() else self.base_dir / path
        return self.base_dir

    @property
    def prompts_path(self) -> Path:
        assert self.generate is not None
        path = Path(self.generate.prompts)
        return path if path.is_absolute() else self.base_dir / path

    @property
    def model_name(self) -> str:
        assert self.generate is not None
        return self.generate.model or self.servers.model or "default"


def _where(msg: str) -> str:
    """msgspec says `$.generate.max_tokens`; people read `[generate] max_tokens`."""

    def repl(m: re.Match[str]) -> str:
        parts = [p for p in m.group(1).split(".") if p]
        if not parts:
            return "the top level"
        if len(parts) == 1:
            return f"[{parts[0]}]"
        return f"[{parts[0]}] {'.'.join(parts[1:])}"

    return re.sub(r"`\$((?:\.[\w\[\]]+)*)`", repl, msg)


def name_problem(name: str) -> str | None:
    """Why `name` cannot be one folder name (a run's, a node's: the console pulls into
    PULL_DIR/NODE/RUN), or None when it can: one path segment, not `.` or `..`, no `/`, no
    control or other unprintable character, at most 255 bytes."""
    if not name:
        return "is empty"
    if name in (".", ".."):
        return "is not a folder name"
    if "/" in name:
        return "holds '/' (one folder name, not a path)"
    bad = next((c for c in name if not c.isprintable()), None)
    if bad is not None:
        return f"holds the unprintable character {bad!r}"
    if len(name.encode()) > 255:
        return "is longer than 255 bytes"
    return None


def _check(spec: RunSpec, path: Path) -> None:
    def fail(key: str, reason: str) -> None:
        raise SpecError(f"{path}: {key}: {reason}")

    if spec.queue is not None:
        q = spec.queue
        if spec.s3 is None:
            fail("[queue]", "a campaign node needs [s3]: the queue lives in the campaign's "
                 "S3 prefix")
        if spec.run.kind != "generate":
            fail("[queue]", "only a generate run takes its work from a queue")
        node_bad = name_problem(q.node)
        if node_bad is not None:
            fail("[queue] node", f"{q.node!r} {node_bad}")
        if not 1 <= q.chunk_size <= 1_000_000:
            fail("[queue] chunk_size", f"{q.chunk_size}: must be 1..1000000")
        if not 2.0 <= q.lease_s <= 86400.0:
            fail("[queue] lease_s", f"{q.lease_s}: must be 2..86400 seconds")
        if q.skew_s is not None and not 0.0 <= q.skew_s <= q.lease_s:
            fail("[queue] skew_s", f"{q.skew_s}: must be 0..lease_s ({q.lease_s})")
        if not q.backup_after >= 1.0:
            fail("[queue] backup_after", f"{q.backup_after}: must be at least 1")
        if not q.poll_s > 0:
            fail("[queue] poll_s", f"{q.poll_s}: must be above 0")
    name_bad = name_problem(spec.run.name)
    if name_bad is not None:
        fail("[run] name", f"{spec.run.name!r} {name_bad}")
    _check_servers(spec.servers, fail)
    _check_ranges(spec, fail)
    if spec.run.kind == "generate":
        gen = spec.generate
        if gen is None:
            fail("[generate]", "missing (required for kind = \"generate\")")
            return
        if not spec.servers.urls and not spec.servers.gpus:
            fail("[servers]", "set either urls (servers started elsewhere) or gpus")
        if spec.servers.urls and spec.servers.gpus:
            fail("[servers]", "set urls or gpus, not both")
        if spec.servers.gpus and not spec.servers.command:
            fail("[servers] command",
                 "required with gpus (a template with {model} {port} and {gpu}, {gpus}, {tp})")
        for i, url in enumerate(spec.servers.urls or []):
            if not re.match(r"^https?://[^/\s]+", url):
                fail(f"[servers] urls[{i}]", f"{url!r} is not an http(s) URL")
        if spec.servers.router:
            _check_router(spec, fail)
        positive = {
            "max_tokens": gen.max_tokens,
            "concurrency_per_server": gen.initial_concurrency,
            "batch_size": gen.batch_size,
            "retries": gen.retries,
            "server_failures_to_down": gen.server_failures_to_down,
            "max_concurrency": gen.max_concurrency,
        }
        for key, value in positive.items():
            if value < 1:
                fail(f"[generate] {key}", f"must be at least 1, got {value}")
        if gen.initial_concurrency > gen.max_concurrency:  # only a level the user wrote
            fail("[generate] concurrency_per_server",
                 f"above max_concurrency {gen.max_concurrency}")
        for key, t in (("request_timeout_s", gen.request_timeout_s),
                       ("connect_timeout_s", gen.connect_timeout_s)):
            if t <= 0:
                fail(f"[generate] {key}", f"must be positive, got {t}")
        if gen.deadline_factor != 0 and gen.deadline_factor < 1:
            fail("[generate] deadline_factor",
                 f"must be 0 (off) or at least 1, got {gen.deadline_factor}")
        # Only a floor the user wrote, and only when deadlines are on: the default follows
        # request_timeout_s, and deadline_factor = 0 never reads it.
        floor = gen.min_deadline_s
        if floor is not None and gen.deadline_factor != 0 \
                and not 0 < floor <= gen.request_timeout_s:
            fail("[generate] min_deadline_s", f"must be positive and at most request_timeout_s "
                 f"({gen.request_timeout_s:g}), got {floor:g}")
        bad_sampling = sampling_problem(gen.sampling)
        if bad_sampling is not None:
            fail(f"[generate.sampling] {bad_sampling[0]}", bad_sampling[1])
        prompts = spec.prompts_path
        if not prompts.is_file():
            fail("[generate] prompts", f"no such file: {prompts}")
    if spec.run.kind == "train":
        if spec.train is None:
            fail("[train]", "missing (required for kind = \"train\")")
            return
        _check_train(spec.train, fail)
    cost = spec.run.cost_per_gpu_hour
    if cost is not None and cost < 0:
        fail("[run] cost_per_gpu_hour", f"must not be negative, got {cost}")
    if spec.alerts.idle_alert_s <= 0:
        fail("[alerts] idle_alert_s", f"must be positive, got {spec.alerts.idle_alert_s}")
    _check_pages(spec.alerts, fail)
    if spec.s3 is not None and not spec.s3.bucket:
        fail("[s3] bucket", "must not be empty")


def _check_router(spec: RunSpec, fail: Callable[[str, str], None]) -> None:
    """`router = true`: one URL, the router's, and one concurrency for it as a whole."""
    urls = spec.servers.urls or []
    if len(urls) != 1:
        fail("[servers] router", f"router = true takes one URL in urls, the router's; got "
             f"{len(urls)} (its workers are listed by the router itself)")
    assert spec.generate is not None
    if spec.generate.auto_concurrency:
        fail("[generate] concurrency_per_server",
             '"auto" tunes each server on its own, but behind SGLang\'s router there is one '
             "server, the router: give a number, the router's concurrency as a whole")


def _check_ranges(spec: RunSpec, fail: Callable[[str, str], None]) -> None:
    """Numbers in their range: every float finite (TOML allows nan and inf), ports 1-65535,
    intervals and timeouts above 0, counts 0 or more, shares between 0 and 1."""
    import math
    from urllib.parse import urlsplit

    sections: list[tuple[str, msgspec.Struct | None]] = [
        ("run", spec.run), ("servers", spec.servers), ("generate", spec.generate),
        ("alerts", spec.alerts), ("train", spec.train)]
    for name, section in sections:
        for key in getattr(section, "__struct_fields__", ()):
            value = getattr(section, key)
            if isinstance(value, float) and not math.isfinite(value):
                fail(f"[{name}] {key}", f"must be a finite number, got {value}")
    sv = spec.servers
    if not 1 <= sv.base_port <= 65535:
        fail("[servers] base_port", f"must be a port between 1 and 65535, got {sv.base_port}")
    if sv.gpus and sv.base_port + len(sv.gpus) - 1 > 65535:
        fail("[servers] base_port", f"{sv.base_port} + {len(sv.gpus)} servers runs past port "
             "65535")
    problem = gpus_problem(sv.gpus or [])
    if problem is not None:
        fail(*problem)
    for i, url in enumerate(sv.urls or []):
        try:
            urlsplit(url).port  # noqa: B018 - a port outside 0-65535 raises here
        except ValueError as exc:
            fail(f"[servers] urls[{i}]", f"{url!r}: {exc}")
    above_zero: list[tuple[str, float]] = [
        ("[servers] startup_timeout_s", sv.startup_timeout_s),
        ("[servers] health_timeout_s", sv.health_timeout_s),
        ("[servers] health_interval_s", sv.health_interval_s),
        ("[servers] hung_restart_s", sv.hung_restart_s),
        ("[alerts] window_s", spec.alerts.window_s),
        ("[alerts] stall_minutes", spec.alerts.stall_minutes),
        ("[alerts] disk_hours", spec.alerts.disk_hours),
        ("[alerts] accept_recent_minutes", spec.alerts.accept_recent_minutes),
        ("[alerts] accept_baseline_hours", spec.alerts.accept_baseline_hours)]
    at_least_zero: list[tuple[str, float]] = [
        ("[servers] restart_backoff_s", sv.restart_backoff_s),
        ("[servers] max_restarts", sv.max_restarts),
        ("[alerts] min_samples", spec.alerts.min_samples),
        ("[alerts] kv_retractions", spec.alerts.kv_retractions)]
    at_least_one: list[tuple[str, int]] = [
        ("[servers] health_failures_to_down", sv.health_failures_to_down)]
    gen = spec.generate
    if gen is not None:
        above_zero.append(("[generate] drain_timeout_s", gen.drain_timeout_s))
        at_least_one.append(("[generate] max_prompt_bytes", gen.max_prompt_bytes))
    for key, number in above_zero:
        if number <= 0:
            fail(key, f"must be more than 0, got {number}")
    for key, number in at_least_zero:
        if number < 0:
            fail(key, f"must not be negative, got {number}")
    for key, count in at_least_one:
        if count < 1:
            fail(key, f"must be at least 1, got {count}")
    for key, share in (("failure_rate", spec.alerts.failure_rate),
                       ("truncation_rate", spec.alerts.truncation_rate),
                       ("empty_rate", spec.alerts.empty_rate),
                       ("accept_drop", spec.alerts.accept_drop),
                       ("accept_fleet_drop", spec.alerts.accept_fleet_drop),
                       ("kv_usage", spec.alerts.kv_usage)):
        if not 0.0 <= share <= 1.0:
            fail(f"[alerts] {key}", f"must be between 0 and 1, got {share}")


def _check_pages(alerts: AlertsSection, fail: Callable[[str, str], None]) -> None:
    """[alerts] webhook and prometheus_textfile. The webhook URL is a secret: its errors
    never quote it."""
    url = alerts.webhook
    if url is not None:
        scheme, sep, rest = url.partition("://")
        if not sep or scheme.lower() not in ("http", "https") or not rest.split("/")[0]:
            fail("[alerts] webhook", "must be an http:// or https:// URL with a host "
                 "(its value is a secret: not shown)")
    if not 1 <= alerts.webhook_per_minute <= 600:
        fail("[alerts] webhook_per_minute", f"{alerts.webhook_per_minute}: must be 1..600")
    if not 1 <= alerts.webhook_queue <= 100_000:
        fail("[alerts] webhook_queue", f"{alerts.webhook_queue}: must be 1..100000")
    if alerts.prometheus_textfile is not None:
        path = Path(alerts.prometheus_textfile).expanduser()
        if path.suffix != ".prom":
            fail("[alerts] prometheus_textfile", f"{path}: must end in .prom (node_exporter's "
                 "textfile collector reads only *.prom files)")
        if not path.is_absolute():
            fail("[alerts] prometheus_textfile", f"{path}: must be an absolute path (the "
                 "folder node_exporter's --collector.textfile.directory names)")
        if not path.parent.is_dir():
            fail("[alerts] prometheus_textfile", f"{path.parent}: no such folder")


def _check_train(train: TrainSection, fail: Callable[[str, str], None]) -> None:
    at_least_one = {
        "max_length": DEFAULT_MAX_LENGTH if train.max_length is None else train.max_length,
        "loss_chunk": train.loss_chunk,
        "drafter_layers": train.drafter_layers,
        "target_features": train.target_features,
        "epochs": train.epochs,
        "batch_size": train.batch_size,
        "grad_accum": train.grad_accum,
        "anchors": train.anchors,
        "save_every": train.save_every,
        "eval_samples": train.eval_samples,
        "keep_last": train.keep_last,
        "nproc": train.nproc,
        "startup_steps": train.startup_steps,
        "eval_prompts": train.eval_prompts,
        "eval_max_new_tokens": train.eval_max_new_tokens,
    }
    for key, value in at_least_one.items():
        if value < 1:
            fail(f"[train] {key}", f"must be at least 1, got {value}")
    if train.block_size < 2:
        fail("[train] block_size",
             f"must be at least 2 (an anchor and a mask), got {train.block_size}")
    if train.max_steps is not None and train.max_steps < 1:
        fail("[train] max_steps", f"must be at least 1, got {train.max_steps}")
    if train.gpu_mem_gib is not None and train.gpu_mem_gib <= 0:
        fail("[train] gpu_mem_gib", f"must be positive, got {train.gpu_mem_gib}")
    for key, share in (("max_under_min_share", train.max_under_min_share),
                       ("max_cut_share", train.max_cut_share),
                       ("heldout_share", train.heldout_share),
                       ("warmup_ratio", train.warmup_ratio)):
        if not 0.0 <= share <= 1.0:
            fail(f"[train] {key}", f"must be between 0 and 1, got {share}")
    for key, positive in (("lr", train.lr), ("clip", train.clip)):
        if positive <= 0:
            fail(f"[train] {key}", f"must be positive, got {positive}")
    if train.gamma is not None and train.gamma <= 0:
        fail("[train] gamma", f"must be positive, got {train.gamma}")
    if train.mask_token_id is not None and train.mask_token_id < 0:
        fail("[train] mask_token_id", f"must not be negative, got {train.mask_token_id}")
    ids = train.target_layer_ids
    if ids is not None:
        if not ids:
            fail("[train] target_layer_ids", "must not be empty")
        if any(i < 0 for i in ids) or sorted(set(ids)) != ids:
            fail("[train] target_layer_ids", f"must be distinct, increasing and >= 0, got {ids}")
    _check_nodes(train, fail)
    if train.data.startswith("s3://") and not re.match(r"^s3://[^/]+", train.data):
        fail("[train] data", f"{train.data!r} names no bucket (s3://bucket/prefix)")


def _check_nodes(train: TrainSection, fail: Callable[[str, str], None]) -> None:
    """[train] nodes, node_rank, rdzv_endpoint and the two timeouts."""
    if train.nodes < 1:
        fail("[train] nodes", f"must be at least 1, got {train.nodes}")
    if not 0 <= train.node_rank < train.nodes:
        fail("[train] node_rank", f"must be between 0 and nodes - 1 ({train.nodes - 1}), got "
             f"{train.node_rank}")
    endpoint = train.rdzv_endpoint
    if train.nodes > 1 and endpoint is None:
        fail("[train] rdzv_endpoint", f'required with nodes = {train.nodes}: "HOST:PORT" of '
             "node rank 0, where the nodes meet")
    if endpoint is not None:
        m = re.fullmatch(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):(\d{1,5})", endpoint)
        if m is None or not 1 <= int(m.group(2)) <= 65535:
            fail("[train] rdzv_endpoint", f"{endpoint!r} is not HOST:PORT (a port 1-65535)")
    if train.node_timeout_s <= 0:
        fail("[train] node_timeout_s", f"must be more than 0, got {train.node_timeout_s}")
    if train.join_timeout_s < train.node_timeout_s:
        fail("[train] join_timeout_s", f"must be at least node_timeout_s "
             f"({train.node_timeout_s:g}), got {train.join_timeout_s:g}")


def _check_servers(servers: ServersSection, fail: Callable[[str, str], None]) -> None:
    """What reaches a shell or a process environment: the command template, env keys and
    values, the model name."""
    from agents.rundir.template import ENV_KEY, template_problem

    if servers.command is not None:
        problem = template_problem(servers.command)
        if problem is not None:
            fail("[servers] command", problem)
    for key, value in servers.env.items():
        if not ENV_KEY.fullmatch(key):
            fail(f"[servers] env {key!r}", "not an environment variable name (letters, digits "
                 "and _, not starting with a digit)")
        if "\x00" in value:
            fail(f"[servers] env {key}", "the value contains a NUL character")
    if servers.model is not None and "\x00" in servers.model:
        fail("[servers] model", "contains a NUL character")
    for name in servers.secret_env:
        if name not in servers.env:
            fail("[servers] secret_env", f"{name!r} is not a key of [servers] env")


def load_run_spec(run_dir: Path) -> RunSpec:
    """The spec a run was launched with: RUN_DIR/run.toml, relative paths resolved against the
    folder of the original file (recorded in RUN_DIR/run.base)."""
    base_file = run_dir / "run.base"
    base = _read_text(base_file).strip() if base_file.exists() else None
    return load_spec(run_dir / "run.toml", base_dir=Path(base) if base else None)


def keep_copy(spec: RunSpec, run_dir: Path) -> None:
    """Keep the spec as launched in RUN_DIR (and where its relative paths start), without its
    secrets: those go to RUN_DIR/secrets.json (0600, never served or pulled)."""
    from agents.rundir import secrets
    from agents.rundir.atomic import atomic_write

    source = Path(spec.source)
    copy = run_dir / "run.toml"
    try:
        raw = tomllib.loads(source.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise SpecError(f"{source}: cannot read it again to keep a copy: {exc}") from None
    raw = merge_overrides(raw, spec.launched_with)
    public, found = secrets.split(raw)
    if source.resolve() == copy.resolve():
        # RUN_DIR is the spec's own folder: this file is served and pulled with the run.
        if found:
            raise SpecError(
                f"{source}: holds secrets ({', '.join(secrets.names(found))}) but lies in its "
                "own run directory, whose files are served and pulled: set [run] dir to a "
                "folder of its own (the secrets are then kept apart, mode 0600)")
        return
    header = f"# fleetdeck: the spec as launched from {secrets.quoted(str(source))}"
    if found:
        header += (f", its secrets kept in {secrets.SECRETS_NAME} (mode 0600, never served or "
                   f"pulled)\n{secrets.MARKER}{', '.join(secrets.names(found))}")
    secrets.write(run_dir, found)
    # run.base first: a copy without it would read its relative paths from RUN_DIR.
    atomic_write(run_dir / "run.base", (str(spec.base_dir) + "\n").encode())
    atomic_write(copy, secrets.to_toml(public, header).encode())


def merge_overrides(raw: dict[str, Any], overrides: dict[str, dict[str, Any]]
                    ) -> dict[str, Any]:
    """The TOML tree with a launch's keys set over it, section by section."""
    out = dict(raw)
    for section, values in overrides.items():
        out[section] = {**out.get(section, {}), **values}
    return out


def load_spec(path: str | Path, base_dir: Path | None = None,
              overrides: dict[str, dict[str, Any]] | None = None) -> RunSpec:
    """Read and validate a run.toml, with a launch's `overrides` set over its keys (kept by
    keep_copy); raise SpecError naming file, key and reason."""
    path = Path(path)
    kept = path.name == "run.toml" and (path.parent / "run.base").exists()
    if base_dir is None and kept:
        # The copy kept in RUN_DIR: its relative paths start where the original's did.
        base_dir = Path(_read_text(path.parent / "run.base").strip())
    try:
        text = _read_text(path)
        raw = tomllib.loads(text)
    except FileNotFoundError:
        raise SpecError(f"{path}: no such file") from None
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(f"{path}: not valid TOML: {exc}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(f"{path}: cannot read: {exc}") from None
    if kept:
        raw = _with_secrets(raw, text, path)
    if overrides:
        raw = merge_overrides(raw, overrides)
    try:
        spec = msgspec.convert(raw, RunSpec)
    except msgspec.ValidationError as exc:
        raise SpecError(f"{path}: {_where(str(exc))}") from None
    spec.source = str(path.resolve())
    if base_dir is not None:
        spec.base = str(base_dir)
    if overrides:
        spec.launched_with = overrides
    _check(spec, path)
    return spec


def _with_secrets(raw: dict[str, Any], text: str, path: Path) -> dict[str, Any]:
    """The copy kept in RUN_DIR with its secrets put back from RUN_DIR/secrets.json."""
    from agents.rundir import secrets

    try:
        found = secrets.read(path.parent)
    except secrets.SecretsError as exc:
        raise SpecError(str(exc)) from None
    if found is None:
        lacking = secrets.marked(text)
        if lacking:
            raise SpecError(f"{path.parent / secrets.SECRETS_NAME}: missing, but {path} was "
                            f"launched with secrets ({', '.join(lacking)}): launch it again "
                            "from the original run.toml")
        return raw
    return secrets.merge(raw, found)


MAX_SPEC_BYTES = 4 * 1024 * 1024


def _read_text(path: Path) -> str:
    """A spec file's text: a regular file only (a FIFO would block the reader for ever, and
    one in a run directory would freeze the agent), opened without blocking, size-limited."""
    import os
    import stat

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise SpecError(f"{path}: cannot read: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise SpecError(f"{path}: not a regular file; refused")
        if st.st_size > MAX_SPEC_BYTES:
            raise SpecError(f"{path}: {st.st_size} bytes, more than a spec can be "
                            f"({MAX_SPEC_BYTES}); refused")
        data = f.read(MAX_SPEC_BYTES + 1)
    try:
        return data.decode()
    except UnicodeDecodeError as exc:
        raise SpecError(f"{path}: not UTF-8 text: {exc}") from None

