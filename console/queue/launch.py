"""A campaign's launch, decided before anything starts: what `launch` carries to each node (its
name in the queue, or its rank for training, and the campaign's name), and why the check
round's answers forbid starting (prompt files that differ, a store that ignores conditional
writes, a run directory shared). A generation node needs no place: it takes work from the
queue, so a node can join a running campaign by launching alone. Pure: the headless
`launch CAMPAIGN` and the TUI both use it."""

from __future__ import annotations

from typing import Any

from console.fleet import Campaign, Fleet, Node


def launch_params(fleet: Fleet, campaign: Campaign, node: Node, spec: str | None
                  ) -> dict[str, Any]:
    """What `launch` carries for one node: its spec, its queue node name (a training
    campaign: its rank and the node count) and the campaign's name."""
    params: dict[str, Any] = {"campaign": campaign.name}
    chosen = spec or campaign.spec_for(node)
    if chosen:
        params["spec"] = chosen
    if fleet.campaign_role(campaign) == "train":
        params["node_rank"] = campaign.position(node.name)
        params["nnodes"] = len(campaign.nodes)
    else:
        params["queue_node"] = node.name
    return params


def check_problems(fleet: Fleet, campaign: Campaign, answers: dict[str, Any]) -> list[str]:
    """Why the check round's answers forbid a launch (empty: go). Every node must run the same
    prompts file (sha256 and line count) on one campaign prefix whose store honours
    conditional writes (each node probed it); two nodes on one machine must not share a run
    directory."""
    problems: list[str] = []
    role = fleet.campaign_role(campaign)
    for name in [n for n in campaign.nodes if n in answers]:
        kind = answers[name].get("kind")
        if kind is not None and kind != role:
            problems.append(f"{name}'s spec is a {kind} run, but campaign {campaign.name} is "
                            f"of {role} nodes")
    if role == "generate":
        digests: dict[str, list[str]] = {}
        for name in [n for n in campaign.nodes if n in answers]:
            a = answers[name]
            key = f"{a.get('prompts_sha256')} ({a.get('prompts_lines')} lines)"
            digests.setdefault(key, []).append(name)
        if len(digests) > 1:
            listed = "; ".join(f"{', '.join(nodes)}: {key}" for key, nodes in digests.items())
            problems.append(f"the nodes' prompt files differ (sha256: {listed}); every shard "
                            "must read the same prompts file")
        prefixes: dict[str, list[str]] = {}
        for name in [n for n in campaign.nodes if n in answers]:
            prefixes.setdefault(str(answers[name].get("queue_prefix")), []).append(name)
        if len(prefixes) > 1:
            listed = "; ".join(f"{', '.join(n)}: {p}" for p, n in prefixes.items())
            problems.append(f"the nodes' [s3] differ ({listed}); a campaign's nodes share one "
                            "queue: the same bucket and prefix")
    places: dict[tuple[str, str], list[str]] = {}
    for name in [n for n in campaign.nodes if n in answers]:
        node = fleet.node(name)
        host = "local" if node.local else f"{node.host}:{node.port or 22}"
        run_dir = str(answers[name].get("run_dir") or node.run_dir)
        places.setdefault((host, run_dir), []).append(name)
    for (host, run_dir), names in places.items():
        if len(names) > 1:
            problems.append(f"{' and '.join(names)} would share the run directory {run_dir} "
                            f"on {host}")
    return problems


def spec_problem(fleet: Fleet, campaign: Campaign, spec: str | None = None) -> str | None:
    """Which nodes would launch without a spec (none in the campaign's table, none of their
    own, none given), or None."""
    if spec or campaign.spec:
        return None
    bare = [n for n in campaign.nodes if not fleet.node(n).spec]
    if not bare:
        return None
    return (f"campaign {campaign.name}: {', '.join(bare)} {'has' if len(bare) == 1 else 'have'}"
            f" no spec to launch: set spec in its [[campaigns]] table (one path, on every "
            f"node) or in the node's own table")
