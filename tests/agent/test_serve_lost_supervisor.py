"""`serve --stdio` relays a request to the supervisor; when the supervisor dies holding it (a
SIGKILL right after a control change was journaled), the caller gets an answer at once, saying the
outcome is unknown (NO_ANSWER), never silence until its own timeout."""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path

from agents.rpc.protocol import NO_ANSWER, RpcClient
from agents.rpc.serve import StdioSession


def test_a_request_the_supervisor_died_holding_is_answered_as_unknown(tmp_path: Path) -> None:
    async def main() -> None:
        up, sup = socket.socketpair()  # serve's upstream <-> the "supervisor"
        out, client = socket.socketpair()  # serve's stdout -> the console
        up_r, up_w = await asyncio.open_connection(sock=up)
        sup_r, sup_w = await asyncio.open_connection(sock=sup)
        _, out_w = await asyncio.open_connection(sock=out)
        client_r, _ = await asyncio.open_connection(sock=client)
        session = StdioSession(tmp_path, out_w)
        session.upstream = RpcClient(up_r, up_w)
        pump = asyncio.create_task(session._relay_back())
        await session._forward({"jsonrpc": "2.0", "id": 7, "method": "max_tokens",
                                "params": {"value": 8192}})
        await session._forward({"jsonrpc": "2.0", "id": 8, "method": "status", "params": {}})
        assert json.loads(await sup_r.readline())["method"] == "max_tokens"
        sup_w.write(b'{"jsonrpc": "2.0", "id": 8, "result": {"status": "running"}}\n')
        await sup_w.drain()
        assert json.loads(await asyncio.wait_for(client_r.readline(), 120))["id"] == 8
        sup_w.close()  # dies with the change in hand
        reply = json.loads(await asyncio.wait_for(client_r.readline(), 120))
        assert reply["id"] == 7 and reply["error"]["code"] == NO_ANSWER
        message = reply["error"]["message"]
        assert str(tmp_path) in message and "before answering max_tokens" in message
        assert "may or may not have been done" in message
        await asyncio.wait_for(pump, 120)
        assert session.upstream is None  # later calls are answered from the run dir
        out_w.close()

    asyncio.run(main())
