"""A TCP forwarder that stands in for a second SGLang server of a supervised run: the supervisor
launches it from the run's command template like any server (its own port, its own process
group), and it passes every connection through to a real server, the tier's shared one.

The real server's address is read from a file that may not exist yet; until it does the
forwarder does not listen, as SGLang does not while it loads, so the supervisor sees a server
that is still starting. Standard library only: it runs under any interpreter.

    python tests/real/forward.py --port PORT --upstream-file FILE   (FILE holds HOST:PORT)
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy until either side closes, then close the other (a client that goes away closes
    the upstream connection, which is how SGLang learns a request was given up on)."""
    try:
        while data := await reader.read(1 << 16):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()


async def serve(port: int, upstream_file: Path) -> None:
    while not upstream_file.exists():
        await asyncio.sleep(0.2)
    host, _, upstream_port = upstream_file.read_text().strip().rpartition(":")

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(host, int(upstream_port))
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

    server = await asyncio.start_server(handle, "127.0.0.1", port)
    print(f"forwarding 127.0.0.1:{port} to {host}:{upstream_port}", flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream-file", type=Path, required=True)
    args = parser.parse_args()
    asyncio.run(serve(args.port, args.upstream_file))


if __name__ == "__main__":
    main()
