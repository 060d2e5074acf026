"""The keys a binding answers to now, written as the footer writes them (the user's
[console.keymap] applied), for hints and buttons that name a key: a remapped key is never
shown under its old name."""

from __future__ import annotations

from typing import Any

from rich.markup import escape
from textual.screen import Screen


def keys_for(screen: Screen[Any], binding_id: str) -> list[str]:
    """Every key that triggers `binding_id` on `screen` now; [] when none does (a hidden or
    disabled action)."""
    app = screen.app
    return [app.get_key_display(active.binding) for active in screen.active_bindings.values()
            if active.binding.id == binding_id]


def key_for(screen: Screen[Any], binding_id: str) -> str:
    """The first key of `binding_id` on `screen`, or "?" when nothing triggers it."""
    keys = keys_for(screen, binding_id)
    return keys[0] if keys else "?"


def mnemonic(label: str, key: str) -> str:
    """A button label naming its key: the key's letter underlined when the label holds it
    (`[u]Y[/u]es` for y), else the key after the label (`Yes (j)`). Console markup."""
    if len(key) == 1 and key.isalnum():
        i = label.lower().find(key.lower()) if key.islower() else label.find(key)
        if i >= 0:
            return f"{escape(label[:i])}[u]{escape(label[i])}[/u]{escape(label[i + 1:])}"
    return f"{escape(label)} ({escape(key)})"
