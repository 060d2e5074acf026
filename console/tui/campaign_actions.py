"""Actions on a campaign's row or screen: asked once, then sent to every node of the campaign
as that node's own call (each node audits it under its own `who`), all at once; each node's
outcome is reported as it would be for that node alone, then a line for the whole. Launch
asks every node first (the check round of console/queue/launch.py) and starts nothing
unless all of them pass. Retry on a generation campaign is the queue's: one node makes the
new generation from the commits (truncated ones at the max tokens last set here on the
campaign), then every node is resumed to run it."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from console.actions import BY_ID
from console.fleet import Campaign
from console.queue.launch import check_problems, launch_params, spec_problem
from console.queue.rollup import from_state
from console.report.series import RunHistory
from console.report.verb import read_history
from console.tui.handlers import Controls
from console.tui.port import ActionPort
from console.tui.widgets import figures as f
from console.tui.widgets.prompt import ValueAnswer, ValueModal
from console.tui.widgets.retry import RetryModal

# What a campaign row answers to; anything else is one node's business.
CAMPAIGN_ACTIONS = ("pause", "unpause", "resize", "resize_up", "resize_down", "autotune",
                    "max_tokens", "retry", "launch", "report")


class CampaignControls:
    def __init__(self, port: ActionPort, controls: Controls) -> None:
        self.port = port
        self.controls = controls  # the per-node handlers, reused for each node
        # Each campaign's max tokens as last set here: a retry of its truncated indices makes
        # the new generation at that limit (as `retry CAMPAIGN truncated --max-tokens N`), so
        # a node the raise missed, or one that joins later, runs it there too.
        self.max_tokens_set: dict[str, int] = {}

    async def run(self, action_id: str, name: str) -> None:
        campaign = self.port.fleet.campaign(name)
        if action_id not in CAMPAIGN_ACTIONS:
            title = BY_ID[action_id].title if action_id in BY_ID else action_id
            self.port.notify(f"{name}: {title} is one node's action; open the campaign and a "
                             "node (enter) for it", severity="warning")
            return
        await getattr(self, action_id)(campaign)

    async def each(self, campaign: Campaign, what: str,
                   per_node: Callable[[str], Awaitable[Any]]) -> None:
        """per_node on every node at once; a summary naming the nodes that did not take it
        (each has had its own report already)."""
        results = await asyncio.gather(*(per_node(n) for n in campaign.nodes))
        failed = [n for n, r in zip(campaign.nodes, results, strict=True) if r is None]
        if failed:
            self.port.report(campaign.name, f"{what}: {len(campaign.nodes) - len(failed)} of "
                             f"{len(campaign.nodes)} nodes; not on {', '.join(failed)}",
                             ok=False)
        else:
            self.port.report(campaign.name, f"{what}: all {len(campaign.nodes)} nodes")

    def _figures(self, campaign: Campaign, figure: Callable[[str], int | None]) -> str:
        """`8 on gen-1, 8 on gen-2, – on gen-3`: one node's value each."""
        return ", ".join(f"{f.num(figure(n))} on {n}" for n in campaign.nodes)

    # -- the actions ------------------------------------------------------------------------

    async def report(self, campaign: Campaign) -> None:
        """One report of every node's history (a node not connected is named in it)."""
        async def one(node: str) -> RunHistory:
            link = self.port.connected_link(node)
            if link is None:
                return RunHistory(node, note="not connected")
            return await read_history(link, node)

        self.port.report(campaign.name, "report: reading every node's history ...")
        runs = list(await asyncio.gather(*(one(n) for n in campaign.nodes)))
        await self.controls.write_report(campaign.name, runs, f"campaign {campaign.name}, "
                                         "through its nodes' history", campaign.name)

    async def pause(self, campaign: Campaign) -> None:
        await self.each(campaign, "pause", lambda n: self.controls.simple(
            n, "pause", "paused: no new requests are sent"))

    async def unpause(self, campaign: Campaign) -> None:
        await self.each(campaign, "unpause", lambda n: self.controls.simple(
            n, "unpause", "unpaused: sending again"))

    async def resize(self, campaign: Campaign) -> None:
        values = {n: self.controls.concurrency(n) for n in campaign.nodes}
        known = [v for v in values.values() if v is not None]
        answer = await self.port.ask(ValueModal(
            f"Concurrency on every node of {campaign.name}",
            "now " + self._figures(campaign, values.get) + " (requests in flight per server)",
            known[0] if known and len(set(known)) == 1 else None, minimum=0))
        if isinstance(answer, ValueAnswer):
            await self.each(campaign, f"concurrency {answer.value}",
                            lambda n: self.controls.resize_to(n, answer.value))

    async def resize_up(self, campaign: Campaign) -> None:
        await self.each(campaign, "one more in flight", self.controls.resize_up)

    async def resize_down(self, campaign: Campaign) -> None:
        await self.each(campaign, "one fewer in flight", self.controls.resize_down)

    async def autotune(self, campaign: Campaign) -> None:
        await self.each(campaign, "auto-tune", self.controls.autotune)

    async def max_tokens(self, campaign: Campaign) -> None:
        def now(n: str) -> int | None:
            p = self.controls.progress(n)
            return p.max_tokens if p is not None else None

        known = {v for n in campaign.nodes if (v := now(n)) is not None}
        answer = await self.port.ask(ValueModal(
            f"Max tokens for new requests on every node of {campaign.name}",
            "now " + self._figures(campaign, now),
            known.pop() if len(known) == 1 else None, minimum=1))
        if isinstance(answer, ValueAnswer):
            self.max_tokens_set[campaign.name] = answer.value
            await self.each(campaign, f"max_tokens {answer.value}", lambda n: self.controls.simple(
                n, "max_tokens", f"max_tokens {answer.value} for new requests",
                {"value": answer.value}))

    async def retry(self, campaign: Campaign) -> None:
        # The roll-up's: on a queue campaign the commits', each index once.
        r = from_state(self.port.state, campaign)
        failed, truncated = r.failed, r.truncated
        queue = self.port.fleet.campaign_role(campaign) == "generate"
        raised = self.max_tokens_set.get(campaign.name) if queue else None
        what = await self.port.ask(RetryModal(
            f"every node of {campaign.name}",
            f"failed now {f.num(failed)}, truncated {f.num(truncated)} across its nodes"
            + (f"; truncated ones run again at max_tokens {raised}" if raised else "")))
        if not what:
            return
        if not queue:
            await self.each(campaign, f"retry {what}", lambda n: self.controls.simple(
                n, "retry", f"retry {what}: re-queued", {"what": what}))
            return
        params: dict[str, Any] = {"what": what}
        if what == "truncated" and raised is not None:
            params["max_tokens"] = raised
        answer = None
        for n in campaign.nodes:
            answer = await self.controls.call(n, "queue_retry", params, timeout=300)
            if isinstance(answer, dict):
                break
        if not isinstance(answer, dict):
            self.port.report(campaign.name, f"retry {what}: no node could make the new "
                             "generation", ok=False)
            return
        self.port.report(campaign.name, f"retry {what}: {answer.get('summary')}")
        if answer.get("generation") is not None:
            await self.each(campaign, "resume for the new generation",
                            lambda n: self.controls.simple(n, "resume", "resumed"))

    async def launch(self, campaign: Campaign) -> None:
        fleet = self.port.fleet
        missing = spec_problem(fleet, campaign)
        if missing is not None:
            self.port.report(campaign.name, missing, ok=False)
            return
        train = fleet.campaign_role(campaign) == "train"
        each = ", ".join(f"{n} rank {campaign.position(n)}" if train else n
                         for n in campaign.nodes)
        if not await self.controls.confirm(
                f"Launch campaign {campaign.name} on {len(campaign.nodes)} nodes?",
                f"Each node ({each}) starts after every node has passed a check (the same "
                f"prompts file, one queue prefix whose store honours conditional writes); if "
                f"one fails, nothing starts anywhere."):
            return
        params = {n: launch_params(fleet, campaign, fleet.node(n), None) for n in campaign.nodes}
        checks = await asyncio.gather(*(self.controls.call(
            n, "launch", {**params[n], "check": True}, timeout=120) for n in campaign.nodes))
        answers = {n: a for n, a in zip(campaign.nodes, checks, strict=True)
                   if isinstance(a, dict)}
        if len(answers) < len(campaign.nodes):
            failed = [n for n in campaign.nodes if n not in answers]
            self.port.report(campaign.name, f"not launched: {', '.join(failed)} did not pass "
                             "the check; nothing was started on any node", ok=False)
            return
        problems = check_problems(fleet, campaign, answers)
        if problems:
            self.port.report(campaign.name, "not launched: " + "; ".join(problems)
                             + "; nothing was started on any node", ok=False)
            return

        async def start(n: str) -> Any:
            reply = await self.controls.call(n, "launch", params[n], timeout=180)
            if isinstance(reply, dict):
                said = reply.get("status") or f"started, supervisor pid " \
                    f"{reply.get('supervisor_pid')}"
                self.port.report(n, f"launch: {said}")
            return reply

        await self.each(campaign, "launch", start)
