"""The `[servers] command` template: checked at spec load, rendered with every value quoted.

The rendered command runs through /bin/sh (the launch script), so the template's own text may
use the shell, while a substituted value never can: each is shell-quoted. A placeholder inside
quotes would undo that quoting (`"{model}"` with a value `'$(x)'` runs x), so it is refused at
load, as are unknown placeholders and lone braces (JSON in a command is written `{{ }}`).

Placeholders: {model}, {port}, and the server's GPUs: {gpus} (its group comma-joined, `0,1`,
as in CUDA_VISIBLE_DEVICES), {tp} (how many: `--tp {tp}`) and {gpu} (the group's first)."""

from __future__ import annotations

import re
import shlex
import string

from agents.rundir.gpugroups import visible_devices

PLACEHOLDERS = ("model", "port", "gpu", "gpus", "tp")
_SHOWN = " ".join("{" + p + "}" for p in PLACEHOLDERS)
ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def template_problem(template: str) -> str | None:
    """Why the template cannot be used, or None."""
    if "\x00" in template:
        return "contains a NUL character"
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:
        return (f"{exc} in {template!r}: write {{{{ and }}}} for a literal brace (as in JSON); "
                f"placeholders are {_SHOWN}")
    for _, field, spec, conversion in parsed:
        if field is None:
            continue
        if field not in PLACEHOLDERS:
            return (f"unknown placeholder {{{field}}}: use {_SHOWN}, and write {{{{ and }}}} "
                    "for a literal brace (as in JSON)")
        if spec or conversion:
            return f"{{{field}}} takes no format spec or conversion, got {template!r}"
    quoted = _quoted_placeholder(template)
    if quoted is not None:
        return (f"{{{quoted}}} is inside quotes: write it bare, fleetdeck quotes every value "
                "itself (inside quotes that quoting would be undone)")
    return None


def _quoted_placeholder(template: str) -> str | None:
    """The first placeholder that sits inside shell quotes (or after a backslash), if any."""
    state = ""  # "", "'" or '"'
    i = 0
    n = len(template)
    while i < n:
        ch = template[i]
        if ch == "{":
            if template.startswith("{{", i):
                i += 2
                continue
            if state:
                end = template.find("}", i)
                return template[i + 1:end] if end > 0 else template[i + 1:]
        elif state == "'":
            if ch == "'":
                state = ""
        elif ch == "\\":
            if template.startswith("{", i + 1) and not template.startswith("{{", i + 1):
                end = template.find("}", i)
                return template[i + 2:end]
            i += 2
            continue
        elif state == '"':
            if ch == '"':
                state = ""
        elif ch in "'\"":
            state = ch
        i += 1
    return None


def render(template: str, model: str, port: int, group: list[int]) -> str:
    """The command line for the server on the GPUs `group`: every value shell-quoted."""
    return template.format(model=shlex.quote(model), port=shlex.quote(str(port)),
                           gpu=shlex.quote(str(group[0])),
                           gpus=shlex.quote(visible_devices(group)),
                           tp=shlex.quote(str(len(group))))
