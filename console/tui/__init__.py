"""The Textual TUI: app, action handlers, palette, messages, screens and widgets. Headless
code never imports this package."""
