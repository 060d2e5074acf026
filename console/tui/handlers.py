"""What each action of the registry does in the TUI: ask (confirm, a value, a choice) when it
must, call the node, and report the agent's answer or error as a notification. One method per
action id (the app handles the navigation ones: NAVIGATION); they run in workers, so a slow
node never blocks the screen. They reach the app only through ActionPort."""

from __future__ import annotations

import asyncio
import time
from functools import partial
from pathlib import Path
from typing import Any

from textual.app import SuspendNotSupported

from agents.rpc.protocol import RpcError
from agents.rundir.gpugroups import label as gpu_label
from agents.rundir.schema import Progress
from console.actions import BY_ID
from console.artifacts.decommission import generation_campaign
from console.logfollow import FollowedLog
from console.report.render import NoMatplotlib, write
from console.report.series import RunHistory
from console.report.verb import read_history, tui_dest
from console.sanitize import shown_markup
from console.shell import SSH_FAILED, NoShell, shell_command
from console.tui.fetched import log_names
from console.tui.messages import LogFetched, SamplesFetched
from console.tui.port import ActionPort
from console.tui.screens.decommission import DecommissionScreen
from console.tui.screens.failures import FailuresScreen
from console.tui.screens.node import GenerateScreen, NodeView
from console.tui.widgets import figures as f
from console.tui.widgets.confirm import ConfirmModal
from console.tui.widgets.prompt import ValueAnswer, ValueModal
from console.tui.widgets.retry import RetryModal

PENDING_S = 5.0  # how long a sent concurrency wins over snapshots that have not caught up
LOG_LINES = 1000  # a log's first tail; then only what it gains
SAMPLES = 12


# Registry actions the app itself handles (they change what is shown, and need no node).
NAVIGATION = frozenset({"fleet", "next_node", "theme"})


class Controls:
    def __init__(self, port: ActionPort) -> None:
        self.port = port
        self._pending_concurrency: dict[str, tuple[int, float]] = {}

    async def run(self, action_id: str) -> None:
        node = self.port.current_node()
        if node is None:
            self.port.notify("no node selected", severity="warning")
            return
        await getattr(self, action_id)(node)

    # -- helpers ----------------------------------------------------------------------------

    def progress(self, node: str) -> Progress | None:
        snap = self.port.state.nodes[node].snapshot
        return snap.progress if snap is not None else None

    async def confirm(self, question: str, detail: str | None = None) -> bool:
        return await self.port.ask(ConfirmModal(question, detail))

    async def call(self, node: str, method: str, params: dict[str, Any] | None = None,
                   timeout: float = 60.0) -> Any:
        """The agent's reply, or None after notifying its error."""
        title = BY_ID[method].title if method in BY_ID else method
        try:
            return await self.port.call_node(node, method, params or {}, timeout)
        except RpcError as exc:
            self.port.report(node, f"{title} refused: {exc.message}", ok=False)
        except (ConnectionError, TimeoutError, OSError) as exc:
            self.port.report(node, f"{title} failed: {exc}", ok=False)
        return None

    async def simple(self, node: str, method: str, done: str,
                     params: dict[str, Any] | None = None) -> Any:
        reply = await self.call(node, method, params)
        if reply is not None:
            rev = reply.get("rev") if isinstance(reply, dict) else None
            self.port.report(node, done + (f" (control rev {rev})" if rev is not None else ""))
        return reply

    # -- run control ------------------------------------------------------------------------

    async def pause(self, node: str) -> None:
        await self.simple(node, "pause", "paused: no new requests are sent")

    async def unpause(self, node: str) -> None:
        await self.simple(node, "unpause", "unpaused: sending again")

    async def resume(self, node: str) -> None:
        reply = await self.call(node, "resume")
        if reply is not None:
            msg = reply.get("message") or reply.get("status") if isinstance(reply, dict) \
                else reply
            self.port.report(node, f"resume: {msg}")

    async def launch(self, node: str) -> None:
        spec = self.port.fleet.node(node).spec
        snap = self.port.state.nodes[node].snapshot
        live = snap is not None and snap.status in ("running", "paused", "draining", "starting")
        detail = (f"A run is live on {node} ({shown_markup(snap.run)}, "
                  f"{shown_markup(snap.status)}); launch resumes it."
                  if live and snap is not None else
                  f"Starts the supervisor, the servers and the job of "
                  f"{spec or 'the run directory'}.")
        if not await self.confirm(f"Launch the run on {node}?", detail):
            return
        reply = await self.call(node, "launch", {"spec": spec} if spec else {}, timeout=180)
        if reply is not None:
            status = reply.get("status", reply) if isinstance(reply, dict) else reply
            self.port.report(node, f"launch: {status}")

    async def stop(self, node: str) -> None:
        if not await self.confirm(f"Stop the job on {node}?",
                                  "The job drains: requests in flight finish, then it stops. "
                                  "The servers stay up; resume starts it again."):
            return
        reply = await self.call(node, "stop", {"servers": False}, timeout=120)
        if reply is not None:
            self.port.report(node, f"stop: {reply.get('status', reply)}")

    async def down(self, node: str) -> None:
        if not await self.confirm(f"Take {node} down?",
                                  "Stops the job, every SGLang server and the supervisor. "
                                  "Finished work stays on disk; launch or resume restarts."):
            return
        reply = await self.call(node, "down", timeout=120)
        if reply is not None:
            self.port.report(node, f"down: {reply.get('status', reply)}")

    async def restart_server(self, node: str) -> None:
        screen = self.port.shown
        chosen = screen.selected_server() if isinstance(screen, GenerateScreen) else None
        if chosen is None:
            self.port.notify("open the node (enter) and select the server's row first",
                            severity="warning")
            return
        number, group = chosen
        where = f"server {number}" + (f" (GPU {gpu_label(group)})" if group else "")
        if not await self.confirm(f"Restart {where} on {node}?",
                                  "Its requests in flight are retried on the other servers."):
            return
        reply = await self.call(node, "restart_server", {"server": number}, timeout=120)
        if reply is not None:
            self.port.report(node, f"restarting {where}: {reply.get('state', reply)}")

    # -- live settings ----------------------------------------------------------------------

    def concurrency(self, node: str) -> int | None:
        """The default concurrency: what was just sent, until snapshots show it."""
        p = self.progress(node)
        pending = self._pending_concurrency.get(node)
        if pending is not None:
            value, at = pending
            if (p is None or p.concurrency != value) and time.monotonic() - at < PENDING_S:
                return value
            del self._pending_concurrency[node]
        return p.concurrency if p is not None else None

    async def _resize(self, node: str, value: int, server: int | None) -> Any:
        params: dict[str, Any] = {"value": value}
        if server is not None:
            params["server"] = server
        else:
            self._pending_concurrency[node] = (value, time.monotonic())
        where = f"server {server}" if server is not None else "every server"
        reply = await self.simple(node, "resize", f"concurrency {value} on {where}", params)
        if reply is None:
            self._pending_concurrency.pop(node, None)
        return reply

    async def resize_to(self, node: str, value: int) -> Any:
        """Every server of the node to `value` (a campaign's resize, node by node)."""
        return await self._resize(node, value, None)

    async def resize(self, node: str) -> None:
        current = self.concurrency(node)
        screen = self.port.shown
        chosen = screen.selected_server() if isinstance(screen, GenerateScreen) else None
        note = f"now {current if current is not None else f.DASH} requests in flight per server"
        answer = await self.port.ask(ValueModal(
            f"Concurrency on {node}", note, current, minimum=0,
            server=chosen[0] if chosen else None))
        if isinstance(answer, ValueAnswer):
            await self._resize(node, answer.value, answer.server)

    async def autotune(self, node: str) -> Any:
        """resize auto: every server's level from then on is the tuner's (the GPU table shows
        each one's choice and measured curve)."""
        return await self.simple(node, "resize", "auto-tune on every server: each finds its knee",
                          {"value": "auto"})

    async def resize_up(self, node: str) -> Any:
        current = self.concurrency(node)
        if current is None:
            self.port.notify(f"{node}: no concurrency known yet", severity="warning")
            return None
        return await self._resize(node, current + 1, None)

    async def resize_down(self, node: str) -> Any:
        current = self.concurrency(node)
        if current is None:
            self.port.notify(f"{node}: no concurrency known yet", severity="warning")
            return None
        if current <= 1:
            self.port.notify(f"{node}: concurrency is {current}; pause to stop sending",
                            severity="warning")
            return None
        return await self._resize(node, current - 1, None)

    async def max_tokens(self, node: str) -> None:
        p = self.progress(node)
        note = None
        if p is not None:
            note = (f"now {f.num(p.max_tokens)} · truncated {f.pct(p.truncated, p.completed)} "
                    f"({f.num(p.truncated)} of {f.num(p.completed)} completions)")
        answer = await self.port.ask(ValueModal(
            f"Max tokens for new requests on {node}", note,
            p.max_tokens if p is not None else None, minimum=1))
        if isinstance(answer, ValueAnswer):
            await self.simple(node, "max_tokens", f"max_tokens {answer.value} for new requests",
                              {"value": answer.value})

    async def retry(self, node: str) -> None:
        p = self.progress(node)
        detail = (f"failed now {f.num(p.failed)}, truncated {f.num(p.truncated)}"
                  + (f" (loops {f.num(p.truncated_loops)}, long "
                     f"{f.num(p.truncated - p.truncated_loops)})" if p.truncated_loops else "")
                  if p is not None else None)
        what = await self.port.ask(RetryModal(node, detail))
        if what == "long":
            await self.simple(node, "retry", "retry truncated --long-only: re-queued",
                              {"what": "truncated", "long_only": True})
        elif what:
            await self.simple(node, "retry", f"retry {what}: re-queued", {"what": what})

    # -- looking ----------------------------------------------------------------------------

    async def export(self, node: str) -> None:
        snap = self.port.state.nodes[node].snapshot
        if snap is not None and snap.kind != "train":
            self.port.report(node, "export: only a training node has a drafter to export",
                             ok=False)
            return
        reply = await self.call(node, "export", {"checkpoint": "best"})
        if isinstance(reply, dict):
            self.port.report(node, f"export started (pid {reply.get('started')}): the serving "
                             f"folder goes to RUN_DIR/export; its log is '{reply.get('log')}'")

    async def logs(self, node: str) -> None:
        """The next log of the run in the log pane (the selected GPU's server log from the
        GPU table): its tail the first time, then only what it gained while it follows; each
        log keeps its place (console/tui/fetched.py LogView)."""
        screen = await self.port.show_node(node)
        name = self._log_name(node, screen)
        view = self.port.fetched[node].logs.get(name)
        if view is not None and not view.follow:
            self.port.post_message(LogFetched(node, name, None, select=True))
        else:
            log = view.log if view is not None else FollowedLog(name)
            reply = await self.call(node, "logs", log.params(LOG_LINES))
            if reply is None:
                return
            self.port.post_message(LogFetched(node, name, reply, select=True))
        shown = self.port.shown
        if isinstance(shown, NodeView):
            shown.show_tab("tab-log")
            shown.log_pane.log_lines.focus()  # its keys: f, /, n, N, w

    def _log_name(self, node: str, screen: NodeView) -> str:
        snap = self.port.state.nodes[node].snapshot
        gpus = [s.gpu if s.gpu is not None else s.number for s in snap.servers] if snap else []
        if isinstance(screen, GenerateScreen) and screen.gpu_table.has_focus:
            chosen = screen.selected_server()
            if chosen is not None:
                # A server's log is named by its first GPU (agents/supervise/servers.py).
                return f"sglang_gpu{chosen[1][0] if chosen[1] else chosen[0]}"
        role = snap.kind if snap is not None else self.port.fleet.node(node).role
        names = log_names(role, gpus)
        shown = self.port.fetched[node].log_name
        if shown is not None and shown in names and screen.active_tab == "tab-log":
            return names[(names.index(shown) + 1) % len(names)]
        return names[0]

    async def samples(self, node: str) -> None:
        snap = self.port.state.nodes[node].snapshot
        if (snap.kind if snap is not None else self.port.fleet.node(node).role) == "train":
            self.port.notify(f"{node}: samples are the completions of a generation run",
                            severity="warning")
            return
        await self.port.show_node(node)
        reply = await self.call(node, "samples", {"n": SAMPLES})
        if reply is not None:
            self.port.post_message(SamplesFetched(node, reply))
            shown = self.port.shown
            if isinstance(shown, GenerateScreen):
                shown.show_tab("tab-samples")

    async def failures(self, node: str) -> None:
        """The node's failures.jsonl by error class, on a screen of its own."""
        if self.port.connected_link(node) is None:
            self.port.report(node, "Failures failed: not connected", ok=False)
            return
        await self.port.open_screen(FailuresScreen(
            node, partial(self.port.connected_link, node), self.port.clock))

    async def shell(self, node: str) -> None:
        """A shell on the node in its run dir (ssh, or here for a local node); the TUI comes
        back when it exits. Needs no link: a node whose agent is down is when one is wanted."""
        try:
            command = shell_command(self.port.fleet.node(node))
        except NoShell as exc:
            self.port.notify(str(exc), severity="error", timeout=12)
            return
        try:
            code = await self.port.lend_terminal(command.argv, command.cwd, command.held)
        except SuspendNotSupported:
            self.port.report(node, "Shell: this console cannot lend its terminal (headless or "
                             "web); run ssh from a terminal", ok=False)
            return
        except OSError as exc:
            self.port.report(node, f"Shell failed: cannot run {command.argv[0]}: {exc}",
                             ok=False)
            return
        if code == SSH_FAILED and command.cwd is None:
            self.port.report(node, f"shell: ssh ended with {code}: it could not connect, or "
                             "the connection broke", ok=False)
        else:
            self.port.report(node, f"shell closed (exit status {code})")

    # -- artifacts ----------------------------------------------------------------------------

    async def report(self, node: str) -> None:
        """The run's whole history as a report (console/report), from the node's link."""
        link = self.port.connected_link(node)
        if link is None:
            self.port.report(node, "Report failed: not connected", ok=False)
            return
        self.port.report(node, "report: reading the run's history ...")
        run = await read_history(link, node)
        await self.write_report(node, [run], f"node {node}, through its history")

    async def write_report(self, name: str, runs: list[RunHistory], source: str,
                           campaign: str | None = None) -> Path | None:
        """Draw and write it in a thread (matplotlib takes seconds); the page's path."""
        dest = tui_dest(self.port.fleet.pull_dir, name)
        title = f"Run report: {'campaign ' if campaign else ''}{name}"
        try:
            path = await asyncio.to_thread(write, dest, title, source, runs, campaign)
        except NoMatplotlib as exc:
            self.port.report(name, f"Report failed: {exc}", ok=False)
            return None
        except OSError as exc:
            self.port.report(name, f"Report failed: cannot write {dest}: "
                             f"{exc.strerror or exc}", ok=False)
            return None
        notes = "; ".join(f"{r.name}: {r.note}" for r in runs if r.note)
        self.port.report(name, f"report written: {path}" + (f" ({notes})" if notes else ""),
                         ok=not notes)
        return path

    async def pull(self, node: str) -> None:
        """Pull into the configured folder, with its progress bar, then the checklist."""
        await self._decommission_screen(node, pull_first=True)

    async def decommission(self, node: str) -> None:
        await self._decommission_screen(node, pull_first=False)

    async def dataset(self, node: str) -> None:
        """`fleetdeck dataset NODE --to PULL_DIR/datasets/NODE`, from the node's pulled copy
        (no link needed: the node may be gone), in a thread; the answer as a notification."""
        import asyncio

        from console.dataset.verb import dataset_for_node

        self.port.report(node, "Dataset: verifying the pulled copy and writing Parquet...")
        try:
            summary = await asyncio.to_thread(dataset_for_node, self.port.fleet, node)
        except ValueError as exc:  # not verified, refused, nothing pulled: said whole
            self.port.report(node, f"Dataset refused: {exc}", ok=False)
            return
        self.port.report(node, f"Dataset: {summary['rows']:,} rows in {summary['shards']} "
                         f"shard(s), {summary['failed']} failed apart, in {summary['dir']}")

    async def _decommission_screen(self, node: str, pull_first: bool) -> None:
        if self.port.connected_link(node) is None:
            what = "Pull" if pull_first else "Decommission check"
            self.port.report(node, f"{what} failed: not connected", ok=False)
            return
        fleet = self.port.fleet
        await self.port.open_screen(DecommissionScreen(
            fleet.node(node), fleet.pull_dir, partial(self.port.connected_link, node),
            pull_first=pull_first, campaign=generation_campaign(fleet, node)))
