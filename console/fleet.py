"""The fleet file: which nodes there are, how to reach them, and the console's settings.

    [console]
    theme = "fleetdeck-dark"
    pull_dir = "~/fleetdeck-pulls"
    alert_command = "~/bin/page-me"        # gets each new alert as JSON on stdin
    [console.keymap]                        # binding id = key (ids: console/tui/keymap.py)
    resize_up = "plus"
    confirm_yes = "j"                       # modals too; old ids (confirm.yes) warn but work

    [[nodes]]
    name = "gen-1"
    host = "gpu-box-7"                      # ~/.ssh/config is honoured
    user = "ubuntu"
    run_dir = "/data/runs/qwen-traces"
    role = "generate"
    spec = "/data/runs/qwen-traces.toml"    # what `launch` starts
    cost_per_gpu_hour = 2.49                # what the console shows, over the run's own

    [[campaigns]]                           # one run across nodes: one queue in S3
    name = "traces-10m"
    nodes = ["gen-1", "gen-2"]              # each takes chunks of work under its own name
    spec = "/data/runs/traces.toml"         # on each node; a node's own `spec` wins
    s3 = "s3://bucket/traces/"              # its [s3]: where `dataset` reads it (optional)
    endpoint_url = "https://s3.example"     # an S3 other than AWS's (optional)
"""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path
from typing import Literal

import msgspec

from agents.rundir.schema import Cost, Progress, cost_of
from agents.rundir.spec import name_problem

DEFAULT_AGENT = "~/.fleetdeck/venv/bin/fleetdeck-agent"
# A pull that receives nothing from the node for this long stops (what arrived is kept for the
# next pull): keepalives only catch a dead connection, not a silent agent.
PULL_STALL_S = 120.0


class FleetError(ValueError):
    """A fleet file that cannot be used; the message names the file, node and key."""


class Node(msgspec.Struct, forbid_unknown_fields=True):
    name: str
    run_dir: str
    role: Literal["generate", "train"] = "generate"
    host: str | None = None
    port: int | None = None
    user: str | None = None
    identity_file: str | None = None
    known_hosts: str | None = None
    agent: str = DEFAULT_AGENT
    spec: str | None = None
    # `local` runs the agent as a subprocess here (the demo and tests): the same bytes as SSH.
    local: bool = False
    connect_timeout_s: float = 10.0
    keepalive_s: float = 15.0
    pull_stall_s: float = PULL_STALL_S
    # Dollars per GPU-hour on this node, for the console's figures: over the run's
    # [run] cost_per_gpu_hour (the node never reads the fleet file).
    cost_per_gpu_hour: float | None = None

    def run_cost(self, progress: Progress | None) -> Cost | None:
        """What the node's run costs as the console shows it: at this node's price when the
        fleet file sets one, else the run's own figures."""
        if progress is None:
            return None
        if self.cost_per_gpu_hour is None:
            return progress.cost
        return cost_of(self.cost_per_gpu_hour, progress.gpus, progress.gpu_hours,
                       progress.total_output_tokens, progress.eta_hours)


class ConsoleSettings(msgspec.Struct, forbid_unknown_fields=True):
    theme: str = "fleetdeck-dark"
    pull_dir: str = "~/fleetdeck-pulls"
    alert_command: str | None = None
    read_only: bool = False
    bell: bool = True
    keymap: dict[str, str] = msgspec.field(default_factory=dict)


class Campaign(msgspec.Struct, forbid_unknown_fields=True):
    """One run across nodes: a generation campaign's nodes take their work from one queue in
    the campaign's S3 prefix (agents/queue), each under its own name; a training campaign
    makes them ranks of one torchrun job. Its role is its nodes' (all generate or all train),
    never written here."""

    name: str
    nodes: list[str]
    spec: str | None = None  # the run spec on each node; a node's own `spec` wins
    # The campaign's S3 prefix (its nodes' [s3]) and endpoint: where the console itself reads
    # its commits (`dataset`). Taken from this file only: the console sends its own S3
    # credentials nowhere a node names.
    s3: str | None = None
    endpoint_url: str | None = None

    def position(self, node: str) -> int:
        """K: the node's place in the campaign (a training campaign's rank)."""
        try:
            return self.nodes.index(node)
        except ValueError:
            raise FleetError(f"campaign {self.name!r}: {node!r} is not one of its nodes "
                             f"({', '.join(self.nodes)})") from None

    def spec_for(self, node: Node) -> str | None:
        return node.spec or self.spec


class Fleet(msgspec.Struct, forbid_unknown_fields=True):
    nodes: list[Node] = msgspec.field(default_factory=list)
    console: ConsoleSettings = msgspec.field(default_factory=ConsoleSettings)
    campaigns: list[Campaign] = msgspec.field(default_factory=list)
    source: str = ""

    def node(self, name: str) -> Node:
        for n in self.nodes:
            if n.name == name:
                return n
        names = ", ".join(n.name for n in self.nodes) or "none"
        raise FleetError(f"{self.source or 'fleet'}: no node named {name!r} (nodes: {names})")

    def campaign(self, name: str) -> Campaign:
        for c in self.campaigns:
            if c.name == name:
                return c
        names = ", ".join(c.name for c in self.campaigns) or "none"
        raise FleetError(f"{self.source or 'fleet'}: no campaign named {name!r} "
                         f"(campaigns: {names})")

    def has_campaign(self, name: str) -> bool:
        return any(c.name == name for c in self.campaigns)

    def campaign_of(self, node: str) -> Campaign | None:
        """The campaign the node belongs to (a node is in one at most)."""
        return next((c for c in self.campaigns if node in c.nodes), None)

    def campaign_role(self, campaign: Campaign) -> Literal["generate", "train"]:
        """generate or train: every node of a campaign has the same role (checked at load)."""
        return self.node(campaign.nodes[0]).role

    @property
    def pull_dir(self) -> Path:
        return Path(os.path.expanduser(self.console.pull_dir))


def default_fleet_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.expanduser("~/.config")
    return Path(base) / "fleetdeck" / "fleet.toml"


def _where(msg: str) -> str:
    def repl(m: re.Match[str]) -> str:
        path = m.group(1)
        node = re.match(r"\.(nodes|campaigns)\[(\d+)\](.*)", path)
        if node:
            rest = node.group(3).lstrip(".")
            return f"{node.group(1)}[{node.group(2)}]" + (f" key {rest}" if rest else "")
        return path.lstrip(".") or "the top level"

    return re.sub(r"`\$((?:\.[\w\[\]]+)*)`", repl, msg)


def load_fleet(path: str | Path | None = None) -> Fleet:
    path = Path(path) if path else default_fleet_path()
    try:
        raw = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise FleetError(f"{path}: no fleet file (write one, or pass --fleet FILE)") from None
    except tomllib.TOMLDecodeError as exc:
        raise FleetError(f"{path}: not valid TOML: {exc}") from None
    except IsADirectoryError:
        raise FleetError(f"{path}: is a folder, not a fleet file") from None
    except UnicodeDecodeError as exc:
        raise FleetError(f"{path}: not UTF-8 text (byte {exc.start}): a fleet file is TOML, "
                         "which is UTF-8") from None
    except OSError as exc:
        raise FleetError(f"{path}: cannot read: {exc.strerror or exc}") from None
    try:
        fleet = msgspec.convert(raw, Fleet)
    except msgspec.ValidationError as exc:
        raise FleetError(f"{path}: {_where(str(exc))}") from None
    fleet.source = str(path)
    seen: set[str] = set()
    for i, node in enumerate(fleet.nodes):
        where = f"{path}: node {node.name!r} (nodes[{i}])"
        if node.name in seen:
            raise FleetError(f"{where}: the name is used twice")
        seen.add(node.name)
        bad = name_problem(node.name)
        if bad is not None:
            # The name is a folder of the pull dir (PULL_DIR/NODE/RUN): one plain name.
            raise FleetError(f"{where}: name {bad}")
        if not node.local and not node.host:
            raise FleetError(f"{where}: host is missing (or set local = true)")
        if not node.run_dir:
            raise FleetError(f"{where}: run_dir is empty")
        if node.cost_per_gpu_hour is not None and node.cost_per_gpu_hour < 0:
            raise FleetError(f"{where}: cost_per_gpu_hour must not be negative, got "
                             f"{node.cost_per_gpu_hour}")
        if node.port is not None and not 1 <= node.port <= 65535:
            raise FleetError(f"{where}: port must be between 1 and 65535, got {node.port}")
        for key in ("connect_timeout_s", "keepalive_s", "pull_stall_s"):
            value = getattr(node, key)
            if not 0 < value < float("inf"):  # also refuses nan, which TOML allows
                raise FleetError(f"{where}: {key} must be a number above 0, got {value}")
    check_campaigns(fleet, str(path))
    return fleet


def check_campaigns(fleet: Fleet, source: str) -> None:
    """Each campaign names known nodes, each once, a node in one campaign at most, all of one
    role; a campaign's name is a plain folder name that is no node's (verbs take either)."""
    nodes = {n.name: n for n in fleet.nodes}
    owner: dict[str, str] = {}
    names: set[str] = set()
    for i, c in enumerate(fleet.campaigns):
        where = f"{source}: campaign {c.name!r} (campaigns[{i}])"
        bad = name_problem(c.name)
        if bad is not None:
            raise FleetError(f"{where}: name {bad}")
        if c.name in names:
            raise FleetError(f"{where}: the name is used twice")
        names.add(c.name)
        if c.name in nodes:
            raise FleetError(f"{where}: name is also a node's; a verb could not tell them apart")
        if c.s3 is not None and not re.fullmatch(r"s3://[^/\s]+(/\S*)?", c.s3):
            raise FleetError(f"{where}: key s3: {c.s3!r} is not s3://BUCKET/PREFIX")
        if c.endpoint_url is not None and not re.fullmatch(r"https?://\S+", c.endpoint_url):
            raise FleetError(f"{where}: key endpoint_url: {c.endpoint_url!r} is not an "
                             "http(s):// URL")
        if not c.nodes:
            raise FleetError(f"{where}: key nodes is empty (name the [[nodes]] it runs on)")
        seen: set[str] = set()
        for name in c.nodes:
            if name not in nodes:
                known = ", ".join(nodes) or "none"
                raise FleetError(f"{where}: key nodes: no node named {name!r} (nodes: {known})")
            if name in seen:
                raise FleetError(f"{where}: key nodes: {name!r} is named twice (once each)")
            seen.add(name)
            if name in owner:
                raise FleetError(f"{where}: key nodes: {name!r} is already in campaign "
                                 f"{owner[name]!r} (a node runs for one campaign)")
            owner[name] = c.name
        roles = {nodes[n].role for n in c.nodes}
        if len(roles) > 1:
            by_role = "; ".join(f"{r}: {', '.join(n for n in c.nodes if nodes[n].role == r)}"
                                for r in sorted(roles))
            raise FleetError(f"{where}: key nodes: mixes generation and training nodes "
                             f"({by_role}); a campaign is one or the other")
