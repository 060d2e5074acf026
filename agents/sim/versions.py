"""What changes with the SGLang version the simulator plays (`--sglang-version`): its routes,
its server-info body, the form of its batch log lines and their `[time tags]` prefix.
Read from the wheels of each release (tests/fixtures/sglang/SOURCES.md)."""

from __future__ import annotations

import re
from dataclasses import dataclass

DEFAULT_VERSION = "0.5.23"
_VERSION = re.compile(r"(\d+)\.(\d+)\.(\d+)(?:\.post(\d+))?")

Release = tuple[int, int, int, int]


def release(version: str) -> Release:
    """`0.4.6.post5` -> (0, 4, 6, 5); a build of main (`0.0.0.dev1+g...`) is the newest."""
    m = _VERSION.match(version)
    if m is None:
        raise ValueError(f"not an SGLang version: {version!r} (e.g. 0.5.1 or 0.4.6.post5)")
    if version.startswith(("0.0.0.dev", "0.1.dev")):
        return (99, 0, 0, 0)
    major, minor, patch, post = m.groups()
    return int(major), int(minor), int(patch), int(post or 0)


@dataclass(frozen=True, slots=True)
class Shape:
    """One SGLang version's outward forms."""

    version: str

    @property
    def r(self) -> Release:
        return release(self.version)

    # ----- routes and the server-info body ---------------------------------------------------

    @property
    def server_info_route(self) -> bool:
        """`/server_info` exists from 0.5.6; before, only `/get_server_info` (then its alias,
        which logs a deprecation warning)."""
        return self.r >= (0, 5, 6, 0)

    @property
    def state_form(self) -> str:
        """Live state in the body: none up to 0.4.3, the first rank's merged into the top level
        in 0.4.4-0.4.6.post1, an `internal_states` list from 0.4.6.post5 (post2-post4 unread:
        taken as the list)."""
        if self.r < (0, 4, 4, 0):
            return "absent"
        if self.r < (0, 4, 6, 2):
            return "top_level"
        return "list"

    @property
    def effective_cap(self) -> bool:
        return self.r >= (0, 5, 8, 0)  # effective_max_running_requests_per_dp

    @property
    def memory_usage_graph_key(self) -> str | None:
        """memory_usage from 0.4.10 (its graph size as `cuda_graph` up to 0.5.1, `graph` after)."""
        if self.r < (0, 4, 10, 0):
            return None
        return "cuda_graph" if self.r < (0, 5, 2, 0) else "graph"

    @property
    def graph_phases(self) -> bool:
        """memory_usage.graph as a dict by phase (prefill, decode, ...) with
        startup_available and token_capacity_swa beside it: seen in 0.5.23 (a number in
        0.5.5.post3 and a build of main of 2026-04; the releases between were not read)."""
        return self.r >= (0, 5, 23, 0)

    @property
    def load_field(self) -> bool:
        return (0, 4, 6, 2) <= self.r < (0, 5, 3, 0)

    @property
    def max_req_input_len(self) -> bool:
        return self.r >= (0, 4, 4, 0)

    @property
    def metrics_rank_labels(self) -> bool:
        """tp_rank/pp_rank (and dp_rank with DP) on scheduler gauges from 0.4.10."""
        return self.r >= (0, 4, 10, 0)

    # ----- log lines ---------------------------------------------------------------------------

    @property
    def date_format(self) -> str:
        return "%H:%M:%S" if self.r < (0, 3, 4, 0) else "%Y-%m-%d %H:%M:%S"

    def head(self, kind: str, forward_ct: int) -> str:
        """`Decode batch.` (up to 0.5.3), `Decode batch [N],` (0.5.4), `Decode batch,`."""
        if self.r < (0, 5, 4, 0):
            return f"{kind} batch."
        if self.r < (0, 5, 4, 1):
            return f"{kind} batch [{forward_ct}],"
        return f"{kind} batch,"

    @property
    def trailing_separator(self) -> bool:
        """`, ` after the last field: 0.4.4-0.4.5 and 0.4.10-0.5.8."""
        return (0, 4, 4, 0) <= self.r < (0, 4, 6, 0) or (0, 4, 10, 0) <= self.r < (0, 5, 9, 0)

    @property
    def accept_len(self) -> bool:
        return self.r >= (0, 4, 2, 0)

    @property
    def accept_rate(self) -> bool:
        return self.r >= (0, 5, 4, 0)

    @property
    def graph_field(self) -> bool:
        """`cuda graph: B` on decode lines: absent up to 0.4.6.post1, present by 0.4.6.post5."""
        return self.r >= (0, 4, 6, 2)

    @property
    def prefill_tail(self) -> str:
        """What ends a prefill line after `#queue-req`: `#pending-token` from 0.5.12, graph and
        input throughput from 0.5.9 (graph after throughput in 0.5.9 only)."""
        return ("pending+graph" if self.r >= (0, 5, 12, 0) else "graph" if self.r >= (0, 5, 10, 0)
                else "throughput+graph" if self.r >= (0, 5, 9, 0) else "")

    def tags(self, dp: int | None, tp: int | None, tp_size: int, ep: int | None = None) -> str:
        """The scheduler's ` DPn TPn EPn` tags: up to 0.4.6.post1 TP always (TP0 with tp 1);
        from then TP only with tp_size > 1, DP only with DP."""
        out = ""
        if dp is not None:
            out += f" DP{dp}"
        if tp is not None and (tp_size > 1 or self.r < (0, 4, 6, 2)):
            out += f" TP{tp}"
        if ep is not None:
            out += f" EP{ep}"
        return out


def shape(version: str | None) -> Shape:
    version = version or DEFAULT_VERSION
    release(version)  # refuses what is not a version
    return Shape(version)
