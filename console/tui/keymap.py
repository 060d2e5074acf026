"""The user's [console.keymap]: which binding ids there are (the app's, every screen's and
every modal's), the old ids still accepted with a warning, and the map for App.set_keymap.

Binding ids are snake_case, one style for all:
- an app binding's id is its action's id in the registry (console/actions.py), which is the RPC
  method name for a node action: `pause`, `max_tokens`, `restart_server`; plus `back` (escape,
  to the fleet) and `quit`;
- a screen's or a modal's is `<screen>_<what>`: `confirm_yes`, `confirm_no`, `prompt_cancel`,
  `choice_cancel`, `retry_failed`, `retry_truncated`, `retry_long`,
  `decommission_pull`,
  `decommission_check`, `decommission_close`, `failures_refresh`, `failures_close`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from textual.binding import Binding
from textual.dom import DOMNode

ID_STYLE = re.compile(r"[a-z][a-z0-9]*(_[a-z0-9]+)*")

# Ids that changed when they took the one style; a fleet file may still use them.
ALIASES: dict[str, str] = {
    "confirm.yes": "confirm_yes",
    "confirm.no": "confirm_no",
    "prompt.cancel": "prompt_cancel",
    "choice.cancel": "choice_cancel",
}


def binding_ids(owners: Iterable[type[DOMNode]]) -> dict[str, str]:
    """Every binding id the owners declare, own or inherited, with its default keys."""
    out: dict[str, str] = {}
    for owner in owners:
        for cls in reversed(owner.__mro__):
            for b in Binding.make_bindings(cls.__dict__.get("BINDINGS", ())):
                if b.id is not None:
                    out.setdefault(b.id, b.key)
    return out


@dataclass(frozen=True, slots=True)
class Keymap:
    keys: dict[str, str]  # binding id -> keys ("k" or "k,ctrl+k"), for App.set_keymap
    warnings: list[str] = field(default_factory=list)  # each names the fleet file and the id


def resolve(wanted: Mapping[str, str], known: Mapping[str, str], source: str) -> Keymap:
    """The fleet file's keymap checked against the known ids: old ids are renamed (with a
    warning), unknown ones dropped (with a warning naming them)."""
    where = f"{source or 'the fleet file'}: [console.keymap]"
    keys: dict[str, str] = {}
    warnings: list[str] = []
    unknown: list[str] = []
    for given, key in wanted.items():
        binding_id = ALIASES.get(given, given)
        if binding_id != given:
            if binding_id in wanted:
                warnings.append(f"{where} sets both {given} (the old id) and {binding_id}; "
                                f"{given} is ignored: remove it")
                continue
            warnings.append(f"{where} {given} is now called {binding_id}; it still works, "
                            f"but rename it")
        if binding_id not in known:
            unknown.append(given)
            continue
        keys[binding_id] = key
    if unknown:
        warnings.append(f"{where} has no binding {', '.join(unknown)}; binding ids: "
                        f"{', '.join(sorted(known))}")
    return Keymap(keys, warnings)
