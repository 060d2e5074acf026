"""Text from a node, made safe to show on a terminal: the one place both the TUI and the
headless console turn a name (a run, a file, a server, an alert message) into something a
terminal shows as written instead of obeying.

Everything a node sends is untrusted: a run or file name may hold an ESC that starts a
terminal escape sequence (move the cursor, retitle the window, rewrite what was printed), a
carriage return that overprints a line, bidirectional overrides that show `gpj.exe` as
`exe.jpg`, or bytes that are not UTF-8 (carried as surrogate escapes). Each such character is
shown escaped (`\\x1b`, `\\r`, `\\u202e`, `\\xff`); everything else is left as it is, so an
ordinary name reads the same. The result is for showing only: never use it as a path.
"""

from __future__ import annotations

# Shown as the escapes people know from C and Python.
_NAMED = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}


def _escape(ch: str) -> str:
    named = _NAMED.get(ch)
    if named is not None:
        return named
    code = ord(ch)
    if 0xDC80 <= code <= 0xDCFF:
        return f"\\x{code - 0xDC00:02x}"  # a byte that was not UTF-8 (surrogateescape)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def shown(text: object, keep_tabs: bool = False, multiline: bool = False) -> str:
    """`text` as a terminal may show it: control, escape, format and undecodable characters
    escaped; `keep_tabs` leaves tabs alone (log lines), `multiline` tabs and newlines (a
    completion's text). Not a path: for display only.

    Python's str.isprintable() is the test: it is false for controls (C0, DEL, C1), format
    characters (bidi overrides, zero-width joiners), separators other than the space,
    surrogates, private-use and unassigned code points."""
    s = text if isinstance(text, str) else str(text)
    if s.isascii() and s.isprintable():
        return s  # the common case, cheaply
    kept = ("\t\n" if multiline else "\t" if keep_tabs else "")
    return "".join(ch if ch.isprintable() or ch in kept else _escape(ch) for ch in s)


def shown_markup(text: object) -> str:
    """`shown(text)` for a place that reads Textual markup (Static, Label, notify): every `[`
    escaped too, so a name such as `[/]` or `[@click=app.quit]` is shown as written, never
    parsed (a tag that does not close crashes the TUI with a MarkupError)."""
    return shown(text).replace("[", "\\[")


__all__ = ["shown", "shown_markup"]
