"""The generation engine: streams a prompt set to SGLang servers and writes completions
crash-safely in batches (run.py is the loop; each other module is one of its parts)."""


class EngineError(RuntimeError):
    """Refusal to start: the message names what and where."""
