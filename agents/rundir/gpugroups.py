"""A server's GPUs: `[servers] gpus` read as groups (a flat list is groups of one), checked at
load, and written out as CUDA_VISIBLE_DEVICES (`0,1`) and as a label for people (`0-1`, `0,2`).

`gpus = [0, 1]` is two servers of one GPU each; `gpus = [[0, 1], [2, 3]]` is two servers of two
GPUs each (tensor parallel or DP attention inside the server: `--tp {tp}`). A group's order is
kept: it is the order CUDA numbers the devices inside the server, and its first GPU is `{gpu}`.
"""

from __future__ import annotations

# The most GPUs one server may span: more than any node has. A status row naming more is not
# a node's (agents/rundir/schema.py refuses it).
MAX_GROUP = 256

GpusSpec = list[int | list[int]]


def groups(gpus: GpusSpec | None) -> list[list[int]]:
    """One list of GPUs per server, in the spec's order (checked by gpus_problem first)."""
    return [list(g) if isinstance(g, list) else [g] for g in gpus or []]


def gpus_problem(gpus: GpusSpec) -> tuple[str, str] | None:
    """Why `[servers] gpus` cannot be used, as (the key, the reason), or None.

    Either every entry is a GPU id or every entry is a group (a list of ids): a mix is most
    likely a missing pair of brackets. Groups may differ in size (each server gets its own
    `{tp}`); a GPU may appear once in the whole list, and ids are 0 or more."""
    kinds = {isinstance(g, list) for g in gpus}
    if len(kinds) > 1:
        grouped = isinstance(gpus[0], list)
        first = next(i for i, g in enumerate(gpus) if isinstance(g, list) != grouped)
        return (f"[servers] gpus[{first}]",
                "mixes GPU ids and groups: write every server's GPUs as a list "
                "(gpus = [[0, 1], [2]]) or every entry as one GPU (gpus = [0, 1, 2])")
    seen: dict[int, str] = {}
    for i, entry in enumerate(gpus):
        where = f"[servers] gpus[{i}]"
        ids = entry if isinstance(entry, list) else [entry]
        if not ids:
            return where, "is an empty group: a server needs at least one GPU"
        if len(ids) > MAX_GROUP:
            return where, f"holds {len(ids)} GPUs, more than a server can span ({MAX_GROUP})"
        for j, gpu in enumerate(ids):
            at = f"{where}[{j}]" if isinstance(entry, list) else where
            if gpu < 0:
                return at, f"must not be negative, got {gpu}"
            if gpu in seen:
                return at, (f"GPU {gpu} is given twice (also at {seen[gpu]}): each GPU belongs "
                            "to one server")
            seen[gpu] = at
    return None


def visible_devices(group: list[int]) -> str:
    """CUDA_VISIBLE_DEVICES for a server on these GPUs, and the `{gpus}` placeholder: `0,1`."""
    return ",".join(str(g) for g in group)


def label(group: list[int]) -> str:
    """The group as people read it: `3`, `0-3` for consecutive ids in rising order, else the
    ids comma-joined (`0,2`, `1,0`: the order is the server's device order)."""
    if len(group) > 1 and group == list(range(group[0], group[0] + len(group))):
        return f"{group[0]}-{group[-1]}"
    return visible_devices(group)
