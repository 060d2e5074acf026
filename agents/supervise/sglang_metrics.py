"""Reading an SGLang server's own figures: `/metrics` (both name generations, one series per
DP rank or one for the server), `/server_info` and `/get_server_info` (every body form since
0.4.0), error bodies, and the one set of figures the supervisor shows, where a value no source
carries stays None (unknown), never 0. The log lines are read by `sglang_log.py`.
Shapes, version by version: tests/fixtures/sglang/SOURCES.md."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agents.supervise.sglang_log import Combined, Startup

_SAMPLE = re.compile(r"(?P<name>(?:sglang:|sglang_)[A-Za-z0-9_:]+)(?:\{(?P<labels>.*)\})?"
                     r"\s+(?P<value>\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
# Labels that name a scheduler process, not the server.
RANK_LABELS = ("dp_rank", "tp_rank", "pp_rank", "moe_ep_rank", "pid")


@dataclass(slots=True)
class Sample:
    name: str  # without the `sglang:` / `sglang_` prefix (the router's /engine_metrics form)
    labels: dict[str, str]
    value: float


def parse_exposition(text: str) -> list[Sample]:
    """The sglang samples of a Prometheus text exposition (NaN and unreadable values left out)."""
    out: list[Sample] = []
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m is None:
            continue
        try:
            value = float(m.group("value"))
        except ValueError:
            continue
        if value != value:
            continue
        labels = dict(_LABEL.findall(m.group("labels") or ""))
        out.append(Sample(m.group("name")[7:], labels, value))
    return out


@dataclass(slots=True)
class MetricsReading:
    """What `/metrics` says about the server: sums over DP ranks for requests and throughput,
    mean and max for KV usage; None where the exposition has no such series."""

    name_generation: str | None = None  # "old" (num_requests_running) | "new" | None
    running_reqs: int | None = None
    queued_reqs: int | None = None
    gen_throughput: float | None = None
    token_usage: float | None = None  # mean over ranks
    token_usage_max: float | None = None
    num_used_tokens: int | None = None
    cache_hit_rate: float | None = None  # a fraction (the old generation printed percent)
    cache_hit_rate_pct: float | None = None
    spec_accept_length: float | None = None  # the window mean; SGLang prints 0.0 when off
    prompt_tokens_total: int | None = None
    generation_tokens_total: int | None = None
    # Requests retracted since the server started (`num_retracted_requests_total`, every
    # rank); 0 from a server that has the gauge `num_retracted_reqs` but has not retracted yet
    # (a counter with labels is printed only once it has counted); None without either.
    retracted_total: int | None = None
    max_running_requests: int | None = None  # old generation's config gauges
    max_total_num_tokens: int | None = None
    context_len: int | None = None
    labels: dict[str, str] = field(default_factory=dict)
    per_rank: dict[str, dict[str, float | int | None]] = field(default_factory=dict)

    @property
    def ranked(self) -> bool:
        """One series per DP rank (0.4.10+); without, a DP server's single series is whichever
        rank wrote last (0.4.4-0.4.9, `mostrecent`), not the server."""
        return bool(self.per_rank)


_RUNNING = ("num_running_reqs", "num_requests_running")
_QUEUED = ("num_queue_reqs", "num_requests_waiting")


def _by_rank(samples: list[Sample], names: tuple[str, ...]) -> dict[str | None, float]:
    """One value per DP rank (None: no dp_rank label) for the first name present. Series of
    several TP ranks of one DP group describe that group once: tp_rank 0 is taken."""
    for name in names:
        series = [s for s in samples if s.name == name]
        if not series:
            continue
        out: dict[str | None, float] = {}
        for s in sorted(series, key=lambda s: s.labels.get("tp_rank", "0") != "0"):
            out.setdefault(s.labels.get("dp_rank"), s.value)
        return out
    return {}


def _int(v: float | None) -> int | None:
    return int(v) if v is not None else None


def read_metrics(text: str) -> MetricsReading:
    samples = parse_exposition(text)
    names = {s.name for s in samples}
    out = MetricsReading()
    if names & {"num_requests_running", "num_requests_waiting"}:
        out.name_generation = "old"
    elif names & {"num_running_reqs", "num_queue_reqs", "num_used_tokens", "spec_accept_length"}:
        out.name_generation = "new"

    def total(names_: tuple[str, ...]) -> float | None:
        values = _by_rank(samples, names_)
        return sum(values.values()) if values else None

    out.running_reqs = _int(total(_RUNNING))
    out.queued_reqs = _int(total(_QUEUED))
    out.gen_throughput = total(("gen_throughput",))
    out.num_used_tokens = _int(total(("num_used_tokens",)))
    usage = _by_rank(samples, ("token_usage",))
    if usage:
        out.token_usage = sum(usage.values()) / len(usage)
        out.token_usage_max = max(usage.values())
    hit = _by_rank(samples, ("cache_hit_rate",))
    if hit:
        mean = sum(hit.values()) / len(hit)
        pct = out.name_generation == "old"
        out.cache_hit_rate = mean / 100 if pct else mean
        out.cache_hit_rate_pct = mean if pct else mean * 100
    accept = {k: v for k, v in _by_rank(samples, ("spec_accept_length",)).items() if v > 0}
    if accept:
        thr = _by_rank(samples, ("gen_throughput",))
        out.spec_accept_length = _accept(
            [(v, thr.get(k)) for k, v in accept.items()])
    for attr in ("prompt_tokens_total", "generation_tokens_total"):
        series = [s.value for s in samples if s.name == attr]
        setattr(out, attr, int(sum(series)) if series else None)
    retracted = [s.value for s in samples if s.name == "num_retracted_requests_total"]
    if retracted:
        out.retracted_total = int(sum(retracted))
    elif "num_retracted_reqs" in names:
        out.retracted_total = 0
    for attr in ("max_running_requests", "max_total_num_tokens", "context_len"):
        setattr(out, attr, _int(total((attr,))))
    for name in (*_RUNNING, *_QUEUED, "gen_throughput", "token_usage"):
        first = next((s for s in samples if s.name == name), None)
        if first is not None:
            out.labels = {k: v for k, v in first.labels.items() if k not in RANK_LABELS}
            break
    rank_fields = (("running_reqs", _RUNNING), ("queued_reqs", _QUEUED),
                   ("gen_throughput", ("gen_throughput",)), ("token_usage", ("token_usage",)))
    per_rank = {f: _by_rank(samples, n) for f, n in rank_fields}
    ranks = sorted({r for values in per_rank.values() for r in values if r is not None},
                   key=lambda r: int(r) if r.isascii() and r.isdigit() else 0)
    for r in ranks:
        row: dict[str, float | int | None] = {}
        for f, values in per_rank.items():
            v = values.get(r)
            row[f] = int(v) if v is not None and f in ("running_reqs", "queued_reqs") else v
        out.per_rank[f"dp_rank={r}"] = row
    return out


def _accept(pairs: list[tuple[float, float | None]]) -> float | None:
    """Accept lengths of several ranks as one: Σtokens / Σverify passes, each rank's passes
    being its throughput / its accept length (see sglang_log.combine). Without throughputs
    (all unknown or 0) the plain mean."""
    known = [(acc, thr) for acc, thr in pairs if acc]
    if not known:
        return None
    if len(known) == 1:
        return known[0][0]
    tokens = sum(thr for _, thr in known if thr)
    passes = sum(thr / acc for acc, thr in known if thr)
    if passes:
        return tokens / passes
    return sum(acc for acc, _ in known) / len(known)


# ----- /server_info and /get_server_info --------------------------------------------------

@dataclass(slots=True)
class ServerInfo:
    """A `/server_info` (0.5.6+) or `/get_server_info` body. Live state: none up to 0.4.3,
    merged into the top level in 0.4.4-0.4.6.post1, an `internal_states` list (one per DP
    rank) since. `placeholder`: the PD mini load balancer's stand-in entry, whose 0.0
    throughput means unknown."""

    internal_states_form: str = "absent"  # "absent" | "top_level" | "list"
    version: str | None = None
    num_internal_states: int = 0
    accept_length_cum: float | None = None
    last_gen_throughput: float | None = None
    max_running_requests: int | None = None  # the CLI argument (None: not set)
    effective_max_running_requests_per_dp: int | None = None  # the first rank's (0.5.8+)
    effective_max_running: int | None = None  # the server's: summed over its DP ranks
    max_total_num_tokens: int | None = None
    max_req_input_len: int | None = None
    speculative_algorithm: str | None = None
    tp_size: int | None = None
    dp_size: int | None = None
    served_model_name: str | None = None
    internal_load: int | None = None
    memory_usage: dict[str, Any] | None = None
    placeholder: bool = False


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def _whole(v: Any) -> int | None:
    return int(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def _text(v: Any) -> str | None:
    return v if isinstance(v, str) else None


_PLACEHOLDER_KEYS = {"last_gen_throughput", "avg_spec_accept_length"}


def read_server_info(body: Any) -> ServerInfo:
    out = ServerInfo()
    if not isinstance(body, dict):
        return out
    out.version = _text(body.get("version"))
    out.max_running_requests = _whole(body.get("max_running_requests"))
    out.max_total_num_tokens = _whole(body.get("max_total_num_tokens"))
    out.max_req_input_len = _whole(body.get("max_req_input_len"))
    out.speculative_algorithm = _text(body.get("speculative_algorithm"))
    out.tp_size = _whole(body.get("tp_size"))
    out.dp_size = _whole(body.get("dp_size"))
    out.served_model_name = _text(body.get("served_model_name"))
    raw = body.get("internal_states")
    if isinstance(raw, list) and raw:
        states = [s for s in raw if isinstance(s, dict)]
        out.internal_states_form = "list"
    elif _PLACEHOLDER_KEYS & set(body):
        states = [body]
        out.internal_states_form = "top_level"
    else:
        return out
    out.num_internal_states = len(states)
    if out.version is None and states and all(
            set(s) <= _PLACEHOLDER_KEYS and not s.get("last_gen_throughput")
            and s.get("avg_spec_accept_length") is None for s in states):
        out.placeholder = True
        return out
    thr = [_num(s.get("last_gen_throughput")) for s in states]
    known = [t for t in thr if t is not None]
    out.last_gen_throughput = sum(known) if known else None
    out.accept_length_cum = _accept(
        [(a, t) for s, t in zip(states, thr, strict=True)
         if (a := _num(s.get("avg_spec_accept_length"))) is not None])
    caps = [_whole(s.get("effective_max_running_requests_per_dp")) for s in states]
    out.effective_max_running_requests_per_dp = caps[0] if caps else None
    if caps and all(c is not None for c in caps):
        out.effective_max_running = sum(c for c in caps if c is not None)
    first = states[0] if states else {}
    out.internal_load = _whole(first.get("load"))
    mem = first.get("memory_usage")
    out.memory_usage = mem if isinstance(mem, dict) else None
    return out


# ----- error bodies -----------------------------------------------------------------------

@dataclass(slots=True)
class ErrorBody:
    """An error answer: OpenAI's `{object, message, type, param, code}`, `{"error": ...}` (401
    and native endpoints) or FastAPI's `{"detail": ...}`. `is_json`: it parsed as sent."""

    is_json: bool
    fields: dict[str, Any]
    raw: str

    @property
    def message(self) -> str:
        f = self.fields
        err = f.get("error")
        if isinstance(err, dict):
            err = err.get("message")
        for v in (f.get("message"), err, f.get("detail")):
            if isinstance(v, str) and v:
                return v
        return self.raw.strip()[:200]


def read_error_body(text: str) -> ErrorBody:
    """Tolerant: a body as pasted into threads may carry `\\'`, which JSON does not allow."""
    for candidate, strict in ((text, True), (text.replace("\\'", "'"), False)):
        try:
            obj = json.loads(candidate)
        except ValueError:
            continue
        if isinstance(obj, dict):
            return ErrorBody(strict, obj, text)
    return ErrorBody(False, {}, text)


# ----- the figures the supervisor shows ---------------------------------------------------

@dataclass(slots=True)
class ServerFigures:
    running_reqs: int | None = None
    queued_reqs: int | None = None
    gen_throughput: float | None = None
    token_usage: float | None = None  # mean over DP ranks, never their sum
    accept_length_window: float | None = None  # /metrics sglang:spec_accept_length
    accept_length_cum: float | None = None  # /server_info avg_spec_accept_length
    effective_max_running: int | None = None
    accept_length_log: float | None = None  # the decode lines, combined over ranks
    # The KV pool: its size (every DP rank's together) and the tokens running requests hold.
    kv_capacity_tokens: int | None = None
    kv_used_tokens: int | None = None
    # Requests retracted (sent back to the queue when decoding ran out of KV room): SGLang's
    # own counter since the server started, and the retraction lines of its log read since
    # the supervisor began to watch it (or since its launch). Two counters of the same
    # events, each used for deltas of its own (agents/supervise/retractions.py).
    retracted_total: int | None = None
    retracted_log: int | None = None


def server_figures(info: ServerInfo | None, metrics: MetricsReading | None,
                   log: Combined | None, startup: Startup | None = None,
                   retracted_log: int | None = None) -> ServerFigures:
    """One set of figures from every source there is. Live gauges come from /metrics, else
    from the log's newest line per rank; a DP server whose /metrics has no rank labels
    (0.4.4-0.4.9) shows one rank there, so its log wins. Throughput falls back to
    /server_info's last window. The running cap: SGLang's per-rank caps summed, else the cap
    the start-up log settled on, else the launch argument."""
    fig = ServerFigures()
    dp = info.dp_size if info is not None and info.dp_size is not None else 1
    use_metrics = metrics is not None and not (dp > 1 and not metrics.ranked
                                               and log is not None and log.ranks_seen > 1)
    sources: list[tuple[int | None, int | None, float | None, float | None]] = []
    if use_metrics and metrics is not None:
        sources.append((metrics.running_reqs, metrics.queued_reqs, metrics.gen_throughput,
                        metrics.token_usage))
    if log is not None:
        sources.append((log.running_reqs, log.queued_reqs, log.gen_throughput,
                        log.token_usage_mean))
    if info is not None:
        sources.append((None, None, info.last_gen_throughput, None))

    def first(pick: Callable[[tuple[int | None, int | None, float | None, float | None]],
                             Any]) -> Any:
        return next((v for v in map(pick, sources) if v is not None), None)

    fig.running_reqs = first(lambda s: s[0])
    fig.queued_reqs = first(lambda s: s[1])
    fig.gen_throughput = first(lambda s: s[2])
    fig.token_usage = first(lambda s: s[3])
    if metrics is not None:
        fig.accept_length_window = metrics.spec_accept_length
    if log is not None:
        fig.accept_length_log = log.accept_length_log
    if info is not None:
        fig.accept_length_cum = info.accept_length_cum
    caps = [info.effective_max_running if info is not None else None,
            startup.max_running_requests if startup is not None else None,
            info.max_running_requests if info is not None else None,
            metrics.max_running_requests if metrics is not None else None]
    fig.effective_max_running = next((c for c in caps if c is not None), None)
    # /metrics has one pool size per DP rank (summed here); /server_info and the start-up
    # line give the first rank's.
    per_rank = [info.max_total_num_tokens if info is not None else None,
                _int(startup.capacity.get("max_total_num_tokens")) if startup is not None
                else None]
    capacity = [metrics.max_total_num_tokens if metrics is not None else None,
                *(c * dp if c is not None else None for c in per_rank)]
    fig.kv_capacity_tokens = next((c for c in capacity if c is not None), None)
    used = [metrics.num_used_tokens if use_metrics and metrics is not None else None,
            log.num_tokens if log is not None else None]
    fig.kv_used_tokens = next((u for u in used if u is not None), None)
    fig.retracted_total = metrics.retracted_total if metrics is not None else None
    fig.retracted_log = retracted_log
    return fig
