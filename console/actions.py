"""The action vocabulary, defined once: the TUI's bindings and palette, the headless verbs and
the RPC methods all come from this table. Binding ids equal RPC method names."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Action:
    id: str  # the RPC method (or a console-only action id)
    key: str  # the default key; remappable through [console.keymap]
    title: str
    description: str
    dangerous: bool = False  # asks y/n first; gone under --read-only
    rpc: bool = True  # False: a console-only action (switch node, theme, pull...)
    # Asks nothing, yet can change anything on the node (a shell there): gone under
    # --read-only like a dangerous action.
    unguarded: bool = False

    @property
    def read_write(self) -> bool:
        """--read-only removes it."""
        return self.dangerous or self.unguarded


ACTIONS: tuple[Action, ...] = (
    Action("launch", "L", "Launch", "start the run on this node (supervisor, servers, job)",
           dangerous=True),
    Action("stop", "s", "Stop", "drain and stop the job; servers stay up", dangerous=True),
    Action("down", "D", "Down", "stop the job, the servers and the supervisor", dangerous=True),
    Action("pause", "p", "Pause", "stop sending new requests"),
    Action("unpause", "P", "Unpause", "send requests again"),
    Action("resume", "r", "Resume", "restart a dead supervisor or a stopped job"),
    Action("resize", "c", "Concurrency", "set requests in flight per server (all or one)"),
    Action("resize_up", "plus", "+ concurrency", "one more request in flight per server"),
    Action("resize_down", "minus", "- concurrency", "one fewer request in flight per server"),
    Action("autotune", "a", "Auto-tune",
           "let each server find its best concurrency from measured throughput (resize auto); "
           "a manual resize takes a server back", rpc=False),
    Action("max_tokens", "m", "Max tokens", "max tokens for new requests"),
    Action("retry", "R", "Retry", "re-queue failed or truncated indices"),
    Action("restart_server", "x", "Restart server", "restart the selected server",
           dangerous=True),
    Action("export", "e", "Export drafter",
           "write the bf16 folder SGLang serves as the DFLASH draft (RUN_DIR/export; pull "
           "takes it)"),
    Action("logs", "l", "Logs", "tail a log of the run"),
    Action("samples", "S", "Samples", "read the latest completions"),
    Action("failures", "F", "Failures", "what is failing: failures and requeues by error class "
           "(counts, first and last time, servers, example lines)"),
    Action("pull", "u", "Pull", "copy the run's artifacts here over SFTP", rpc=False),
    Action("dataset", "T", "Dataset",
           "the pulled run's verified lines as a Hugging Face dataset (Parquet + card) in "
           "PULL_DIR/datasets/NODE (`fleetdeck dataset`)", rpc=False),
    Action("report", "H", "Report",
           "the run's report: its whole history as plots and a summary, one HTML page and "
           "PNGs, written to the pull dir's reports/ folder (a campaign: every node)",
           rpc=False),
    Action("decommission", "k", "Decommission", "checklist: safe to give the node back?",
           rpc=False),
    Action("shell", "exclamation_mark", "Shell",
           "a shell on the node in its run directory (ssh with the fleet file's settings); "
           "exit it to come back", rpc=False, unguarded=True),
    Action("next_node", "n", "Next node", "show the next node", rpc=False),
    Action("fleet", "f", "Fleet", "back to the fleet view", rpc=False),
    Action("theme", "t", "Theme", "cycle the colour theme", rpc=False),
)

BY_ID = {a.id: a for a in ACTIONS}


def visible(read_only: bool) -> tuple[Action, ...]:
    """`--read-only` removes every dangerous action (and the shell), from keys and palette
    alike."""
    return tuple(a for a in ACTIONS if not (read_only and a.read_write))
