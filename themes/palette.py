"""fleetdeck's colour themes, as Textual `Theme`s: a dark default, a light one and a
high-contrast one for a bright room or a tired operator. Registered by the console app."""

from __future__ import annotations

from textual.theme import Theme

DARK = Theme(
    name="fleetdeck-dark",
    primary="#4EA1D3",
    secondary="#7AA89F",
    accent="#E0A45E",
    warning="#E8C15A",
    error="#E5534B",
    success="#57AB5A",
    foreground="#D6DCE2",
    background="#14181D",
    surface="#1B2027",
    panel="#232A33",
    dark=True,
    variables={"footer-key-foreground": "#E0A45E", "block-cursor-text-style": "bold"},
)

LIGHT = Theme(
    name="fleetdeck-light",
    primary="#1F6FA8",
    secondary="#3F7D72",
    accent="#B4621B",
    warning="#9A6700",
    error="#C0362C",
    success="#2D7D32",
    foreground="#1F2328",
    background="#F6F8FA",
    surface="#FFFFFF",
    panel="#E6EBF0",
    dark=False,
    variables={"footer-key-foreground": "#B4621B"},
)

HIGH_CONTRAST = Theme(
    name="fleetdeck-high-contrast",
    primary="#00BFFF",
    secondary="#FFFFFF",
    accent="#FFD700",
    warning="#FFFF00",
    error="#FF3030",
    success="#00FF66",
    foreground="#FFFFFF",
    background="#000000",
    surface="#000000",
    panel="#1A1A1A",
    dark=True,
    luminosity_spread=0.3,
    text_alpha=1.0,
    variables={"footer-key-foreground": "#FFD700", "block-cursor-text-style": "bold reverse"},
)

THEMES: tuple[Theme, ...] = (DARK, LIGHT, HIGH_CONTRAST)
DEFAULT_THEME = DARK.name
NAMES: tuple[str, ...] = tuple(t.name for t in THEMES)
