"""Where pull reads a run's bytes from, one class per data path: the node's agent streaming the
files through OpenSSH's `ssh` (C, AES-GCM, a few streams; console/artifacts/streamed.py),
OpenSSH's `sftp` client in batch mode (console/artifacts/opensftp.py), SFTP on the agent link's
asyncssh connection (pipelined reads in Python, about half scp's speed), or the file system for
a node on this machine. FLEETDECK_PULL_DATA_PATH=stream|openssh|asyncssh picks one (tests,
benchmarks, a broken client); by default the stream when `ssh` is installed, else sftp."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from typing import Protocol

import asyncssh

from console.artifacts import opensftp, streamed
from console.fleet import Node

CHUNK = 4 * 1024 * 1024
# OpenSSH's sftp-server answers at most 255 KiB per read; asking for 256 KiB got 255 back and
# asyncssh fetched the missing 1 KiB with a second request, doubling the requests.
SFTP_READ = 255 * 1024
# Which data path pull takes: "stream", "openssh" (sftp), "asyncssh", or unset (the stream
# when OpenSSH's ssh is installed).
DATA_PATH_ENV = "FLEETDECK_PULL_DATA_PATH"


class PullError(RuntimeError):
    pass


class Source(Protocol):
    data_path: str

    async def read(self, rel: str, offset: int, length: int,
                   sink: Callable[[bytes], None]) -> None: ...

    async def close(self) -> None: ...


class SftpSource:
    """Reads from RUN_DIR on the node over SFTP, with many requests in flight per file."""

    data_path = "asyncssh"

    def __init__(self, sftp: asyncssh.SFTPClient, run_dir: str) -> None:
        self.sftp = sftp
        self.run_dir = run_dir

    async def read(self, rel: str, offset: int, length: int,
                   sink: Callable[[bytes], None]) -> None:
        # As bytes: a name that is not UTF-8 (surrogate escapes here) is asked for as it is.
        async with self.sftp.open(os.fsencode(f"{self.run_dir}/{rel}"), "rb",
                                  block_size=SFTP_READ, max_requests=64) as f:
            pos, end = offset, offset + length
            while pos < end:
                data = await f.read(min(CHUNK, end - pos), pos)
                assert isinstance(data, bytes)  # opened in binary mode
                if not data:
                    raise PullError(f"{rel}: the file ended at {pos} bytes, the manifest "
                                    f"says {end}")
                sink(data)
                pos += len(data)

    async def close(self) -> None:
        self.sftp.exit()


class LocalSource:
    """The same, for a node on this machine (the demo, tests of the local transport)."""

    data_path = "local"

    def __init__(self, run_dir: str) -> None:
        self.run_dir = run_dir

    async def read(self, rel: str, offset: int, length: int,
                   sink: Callable[[bytes], None]) -> None:
        def copy() -> None:
            with open(os.path.join(self.run_dir, rel), "rb") as f:
                f.seek(offset)
                left = length
                while left:
                    data = f.read(min(CHUNK, left))
                    if not data:
                        raise PullError(f"{rel}: shorter than the manifest says")
                    sink(data)
                    left -= len(data)

        await asyncio.to_thread(copy)

    async def close(self) -> None:
        return None


class OpensshSource:
    """Pull through OpenSSH's clients (the Puller hands whole batches to `fetcher`: the agent's
    stream over `ssh`, or `sftp`; `sftp_fetcher` is sftp for a stream the node's agent cannot
    serve, when sftp is installed); `read` serves the few files sftp cannot name, over SFTP on
    the agent link's connection."""

    def __init__(self, node: Node, sftp: str | None, conn: asyncssh.SSHClientConnection | None,
                 ssh: str | None = None) -> None:
        self.node = node
        self.sftp_fetcher = (opensftp.SftpFetcher(sftp, node, node.run_dir)
                             if sftp is not None else None)
        self.fetcher: opensftp.SftpFetcher | streamed.StreamFetcher
        if ssh is not None:
            self.fetcher = streamed.StreamFetcher(ssh, node)
        else:
            assert self.sftp_fetcher is not None, "one of ssh and sftp is needed"
            self.fetcher = self.sftp_fetcher
        self.data_path = self.fetcher.data_path
        self.conn = conn  # the agent link's, for the names sftp cannot fetch
        self._fallback: SftpSource | None = None

    async def read(self, rel: str, offset: int, length: int,
                   sink: Callable[[bytes], None]) -> None:
        if self._fallback is None:
            if self.conn is None:
                raise PullError(f"{rel}: sftp cannot fetch this name and there is no SSH "
                                "connection to fall back on")
            self._fallback = SftpSource(await self.conn.start_sftp_client(), self.node.run_dir)
        await self._fallback.read(rel, offset, length, sink)

    def prestart(self) -> None:
        """The stream's ssh processes started now, to log in while the pull reads the
        manifest (streamed.StreamFetcher.prestart)."""
        if isinstance(self.fetcher, streamed.StreamFetcher):
            self.fetcher.prestart()

    async def close(self) -> None:
        if isinstance(self.fetcher, streamed.StreamFetcher):
            await self.fetcher.close()
        if self._fallback is not None:
            await self._fallback.close()


def choose_data_path(data_path: str | None = None) -> str:
    """The data path asked for (argument, else FLEETDECK_PULL_DATA_PATH): "stream" when OpenSSH's
    ssh is installed, else "openssh" (its sftp) when that is, else "asyncssh"."""
    choice = (data_path or os.environ.get(DATA_PATH_ENV) or "auto").strip().lower()
    if choice not in ("auto", "stream", "openssh", "asyncssh"):
        raise PullError(f"{DATA_PATH_ENV}={choice!r}: expected stream, openssh or asyncssh")
    if choice == "auto":
        if streamed.find_ssh():
            return "stream"
        return "openssh" if opensftp.find_sftp() else "asyncssh"
    return choice


async def open_source(node: Node, conn: asyncssh.SSHClientConnection | None,
                      data_path: str | None = None) -> Source:
    if node.local:
        return LocalSource(node.run_dir)
    chosen = choose_data_path(data_path)
    if chosen == "stream":
        ssh = streamed.find_ssh()
        if ssh is None:
            raise PullError("OpenSSH's ssh client is not installed (PATH); install "
                            "openssh-client or use FLEETDECK_PULL_DATA_PATH=asyncssh")
        return OpensshSource(node, opensftp.find_sftp(), conn, ssh=ssh)
    if chosen == "openssh":
        sftp = opensftp.find_sftp()
        if sftp is None:
            raise PullError("OpenSSH's sftp client is not installed (PATH); install "
                            "openssh-client or use FLEETDECK_PULL_DATA_PATH=asyncssh")
        return OpensshSource(node, sftp, conn)
    assert conn is not None
    return SftpSource(await conn.start_sftp_client(), node.run_dir)
