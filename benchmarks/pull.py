"""Pull throughput: 1 GB in ten 100 MB files plus 1,000 small ones, over a real sshd on loopback.

`fleetdeck pull` (pull_node over an AgentLink with PULL_CIPHERS, sha256 of every file checked
against the manifest, fsync) beside OpenSSH `scp -r` (its default cipher, then AES-GCM) and
`rsync -a` over ssh, measured in the same run. Pull's data path is printed: the agent's
framed stream over OpenSSH's ssh, a few at once ("stream", the default), OpenSSH's sftp
client in parallel batches ("openssh"), or asyncssh's SFTP ("asyncssh"); `--engine` forces
one. The node's manifest cache is warmed once beforehand (not timed), so pull is measured as
transfer + client-side checksum, as on a node whose agent has hashed its files already. Each
transfer runs `--runs` times into a fresh destination, in rounds that interleave the tools;
the best of each counts. Prints MB/s (10^6 bytes) and the ratios pull/scp, pull/rsync and
pull/rsync-fsync (rsync -a --fsync: durable when it returns, as pull is).
Target: pull >= 1.0x rsync -a.

    .venv/bin/python benchmarks/pull.py [--big 10] [--big-mb 100] [--small 1000] [--runs 2]
                                        [--engine auto|stream|openssh|asyncssh]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from console.artifacts.decommission import pull_node  # noqa: E402
from console.artifacts.opensftp import sftp_command  # noqa: E402
from console.artifacts.pull import PULL_CIPHERS  # noqa: E402
from console.artifacts.pullset import fetch_manifest  # noqa: E402
from console.fleet import Node  # noqa: E402
from console.transport import AgentLink  # noqa: E402
from tests.servers.sshd import SshServer, start_sshd  # noqa: E402

AGENT = f"{sys.executable} -m agents.cli"
MB = 10**6
GCM = "aes128-gcm@openssh.com"


def build_tree(run_dir: Path, big: int, big_mb: int, small: int) -> tuple[int, int]:
    """Big files under logs/, small ones under logs/small/ (all kind "log": all in the pull
    set). Returns (bytes, files)."""
    (run_dir / "logs" / "small").mkdir(parents=True)
    total = 0
    for i in range(big):
        with open(run_dir / "logs" / f"big_{i:02d}.log", "wb") as f:
            for _ in range(big_mb):
                f.write(os.urandom(MB))
        total += big_mb * MB
    rng = random.Random(0)
    for i in range(small):
        size = rng.randint(1024, 8192)
        (run_dir / "logs" / "small" / f"s_{i:04d}.log").write_bytes(os.urandom(size))
        total += size
    return total, big + small


def tree_size(folder: Path) -> tuple[int, int]:
    """(bytes, files) under folder, leaving out fleetdeck's state and the manifest cache."""
    total = files = 0
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = [d for d in dirnames if d != ".fleetdeck"]
        for name in filenames:
            if name != ".manifest_cache.json":
                total += os.path.getsize(os.path.join(dirpath, name))
                files += 1
    return total, files


def make_node(sshd: SshServer, run_dir: Path) -> Node:
    return Node(name="bench", host=sshd.host, port=sshd.port, user=sshd.user,
                identity_file=str(sshd.client_key), known_hosts=str(sshd.known_hosts),
                run_dir=str(run_dir), agent=AGENT, connect_timeout_s=10)


def ssh_options(sshd: SshServer) -> list[str]:
    """What scp, rsync and ssh share: our key and known_hosts, no user config, no prompts."""
    return ["-F", "/dev/null", "-i", str(sshd.client_key), "-o", "IdentitiesOnly=yes",
            "-o", f"UserKnownHostsFile={sshd.known_hosts}", "-o", "StrictHostKeyChecking=yes",
            "-o", "BatchMode=yes"]


def default_cipher(sshd: SshServer) -> str:
    """The cipher OpenSSH negotiates with no -c (what scp and rsync's ssh use)."""
    r = subprocess.run(["ssh", "-v", *ssh_options(sshd), "-p", str(sshd.port),
                        f"{sshd.user}@{sshd.host}", "true"], capture_output=True, text=True,
                       timeout=30, check=True)
    m = re.search(r"kex: server->client cipher: (\S+)", r.stderr)
    return m.group(1) if m else "?"


async def warm_manifest(node: Node) -> int:
    link = AgentLink(node)
    await link.connect()
    try:
        return len(await fetch_manifest(link.call))
    finally:
        await link.close()


async def pull_once(node: Node, dest: Path, engine: str | None
                    ) -> tuple[float, float, str, str]:
    """(seconds end to end, seconds of them spent connecting the agent link, data path, its
    cipher). As `fleetdeck pull` does, pull_node connects the link itself, after the
    stream's ssh logins have begun."""
    t0 = time.perf_counter()
    link = AgentLink(node, ciphers=PULL_CIPHERS)
    connected = link.connect
    t_conn = [0.0]

    async def timed_connect() -> dict[str, object]:
        t = time.perf_counter()
        try:
            return await connected()
        finally:
            t_conn[0] = time.perf_counter() - t

    link.connect = timed_connect  # type: ignore[method-assign]
    try:
        report = await pull_node(link, node, dest, everything=True, data_path=engine,
                                 connect=True)
        assert link.conn is not None
        cipher = str(link.conn.get_extra_info("send_cipher"))
    finally:
        await link.close()
    wall = time.perf_counter() - t0
    if not report.ok:
        raise SystemExit(f"pull failed: {dict(list(report.failed.items())[:5])}")
    for note in report.notes:
        print(f"  pull: {note}")
    if report.data_path in ("openssh", "stream"):
        # OpenSSH's own connections: the cipher it picks from opensftp.CIPHERS.
        cipher = sftp_cipher(node)
    return wall, t_conn[0], report.data_path, cipher


def sftp_cipher(node: Node) -> str:
    """The cipher pull's sftp processes negotiate (their command, with ssh -v, running `pwd`)."""
    with tempfile.NamedTemporaryFile("w", suffix=".batch") as batch:
        batch.write("pwd\n")
        batch.flush()
        cmd = sftp_command(shutil.which("sftp") or "sftp", node, Path(batch.name))
        # -v instead of -q: ssh prints what it negotiated.
        r = subprocess.run([cmd[0], "-v", *(a for a in cmd[1:] if a != "-q")],
                           capture_output=True, text=True, timeout=30)
    m = re.search(r"kex: server->client cipher: (\S+)", r.stderr)
    return m.group(1) if m else "?"


def load() -> str:
    try:
        return " ".join(f"{v:.2f}" for v in os.getloadavg())
    except OSError:
        return "?"


def run_cmd(cmd: list[str]) -> float:
    t = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - t
    if r.returncode != 0:
        raise SystemExit(f"{cmd[0]} failed ({r.returncode}): {r.stderr.strip()[:2000]}")
    return wall


def scp_cmd(sshd: SshServer, run_dir: Path, dest: Path, cipher: str | None) -> list[str]:
    return ["scp", "-r", "-q", *ssh_options(sshd), *(["-c", cipher] if cipher else []),
            "-P", str(sshd.port), f"{sshd.user}@{sshd.host}:{run_dir}", str(dest)]


def rsync_cmd(sshd: SshServer, run_dir: Path, dest: Path, fsync: bool = False) -> list[str]:
    ssh = " ".join(["ssh", *ssh_options(sshd), "-p", str(sshd.port)])
    return ["rsync", "-a", *(["--fsync"] if fsync else []), "-e", ssh,
            f"{sshd.user}@{sshd.host}:{run_dir}/", f"{dest}/"]


def box_cpu_s() -> float | None:
    """CPU seconds the whole box has been busy (every process and kernel thread: both ends of
    the transfer, sshd, the disk's write-back), from /proc/stat; None where there is none."""
    try:
        with open("/proc/stat") as f:
            ticks = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle, iowait
    return (sum(ticks[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def measure(scratch: Path, expect: tuple[int, int], name: str, once: Callable[[Path], float]
            ) -> tuple[float, float | None]:
    """(wall seconds, box CPU seconds) of one transfer into a fresh destination, which is
    checked for size and file count, then deleted (only the source and one copy are on disk at
    once). Dirty pages are written out first (not timed), so no transfer pays for the
    write-back of the one before."""
    dest = scratch / f"dest-{name.split()[0]}"
    os.sync()
    try:
        cpu0 = box_cpu_s()
        wall = once(dest)
        cpu1 = box_cpu_s()
        got = tree_size(dest)
        if got != expect:
            raise SystemExit(f"{name}: {got[1]} files, {got[0]:,} bytes arrived; expected "
                             f"{expect[1]} files, {expect[0]:,} bytes")
        return wall, (None if cpu0 is None or cpu1 is None else cpu1 - cpu0)
    finally:
        shutil.rmtree(dest, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--big", type=int, default=10, help="number of big files")
    ap.add_argument("--big-mb", type=int, default=100, help="size of each big file, MB")
    ap.add_argument("--small", type=int, default=1000, help="number of 1-8 KB files")
    ap.add_argument("--runs", type=int, default=2, help="runs of each transfer (best counts)")
    ap.add_argument("--no-gcm-scp", action="store_true", help="skip scp -c " + GCM)
    ap.add_argument("--no-rsync-fsync", action="store_true", help="skip rsync -a --fsync")
    ap.add_argument("--engine", choices=["auto", "stream", "openssh", "asyncssh"],
                    default="auto", help="pull's data path (default: the agent's stream over "
                    "OpenSSH's ssh when installed)")
    args = ap.parse_args()
    if shutil.which("rsync") is None:
        raise SystemExit("rsync is missing: apt-get update && apt-get install -y rsync")

    scratch = Path(tempfile.mkdtemp(prefix="fd-bench-pull-"))
    sshd: SshServer | None = None
    try:
        run_dir = scratch / "run"
        t = time.perf_counter()
        nbytes, nfiles = build_tree(run_dir, args.big, args.big_mb, args.small)
        print(f"tree: {nfiles:,} files, {nbytes / MB:,.0f} MB ({args.big} x {args.big_mb} MB "
              f"+ {args.small:,} of 1-8 KB), built in {time.perf_counter() - t:.1f} s")
        sshd = server = start_sshd(scratch / "sshd")
        node = make_node(server, run_dir)
        t = time.perf_counter()
        listed = asyncio.run(warm_manifest(node))
        print(f"manifest cache warmed once, not timed ({listed:,} entries hashed on the node in "
              f"{time.perf_counter() - t:.1f} s): pull below is transfer + client-side sha256 "
              "check + fsync")
        ssh_cipher = default_cipher(server)
        expect = (nbytes, nfiles)
        pull_path = ["", ""]  # data path, cipher
        pull_conn: list[float] = []
        engine = None if args.engine == "auto" else args.engine

        def pull(dest: Path) -> float:
            # pull_node writes into DEST/<node>/<run>/; its .fleetdeck/ is not counted.
            wall, conn, pull_path[0], pull_path[1] = asyncio.run(pull_once(node, dest, engine))
            pull_conn.append(conn)
            return wall

        transfers: list[tuple[str, str, Callable[[Path], float]]] = [
            ("fleetdeck pull", "pull", pull),
            ("scp", "scp", lambda d: run_cmd(scp_cmd(server, run_dir, d, None))),
            ("rsync", "rsync", lambda d: run_cmd(rsync_cmd(server, run_dir, d))),
        ]
        if not args.no_rsync_fsync:
            # What pull promises (every file on disk when it says so), from rsync.
            transfers.append(("rsync --fsync", "rsync-fsync",
                              lambda d: run_cmd(rsync_cmd(server, run_dir, d, fsync=True))))
        if not args.no_gcm_scp:
            transfers.insert(2, ("scp -c aes128-gcm", "scp-gcm", lambda d: run_cmd(
                scp_cmd(server, run_dir, d, GCM))))
        # Rounds interleave the tools, so a slow spell of the shared host hits them all.
        print(f"transfers ({args.runs} rounds, best of each counts; 2 shared cores: expect "
              "noise):")
        print(f"load average at start: {load()}")
        times: dict[str, list[float]] = {short: [] for _, short, _ in transfers}
        cpus: dict[str, list[float]] = {short: [] for _, short, _ in transfers}
        for r in range(args.runs):
            for name, short, once in transfers:
                wall, cpu = measure(scratch, expect, name, once)
                times[short].append(wall)
                if cpu is not None:
                    cpus[short].append(cpu)
                print(f"  round {r + 1}  {name:<18} {wall:6.2f} s  {nbytes / MB / wall:7.1f} "
                      f"MB/s  box CPU {'?' if cpu is None else f'{cpu:.2f} s'}", flush=True)
        print(f"load average at end: {load()}")
        labels = {"pull": f"fleetdeck pull ({pull_path[0]}: {pull_path[1]})",
                  "scp": f"scp -r (default: {ssh_cipher})", "scp-gcm": f"scp -r -c {GCM}",
                  "rsync": f"rsync -a over ssh ({ssh_cipher})",
                  "rsync-fsync": f"rsync -a --fsync over ssh ({ssh_cipher})"}
        results = [(labels[short], short, min(times[short])) for _, short, _ in transfers]
        print(f"\nbest of {args.runs}, {nbytes / MB:,.0f} MB in {nfiles:,} files:")
        for name, _, wall in results:
            print(f"  {name:<50} {wall:6.2f} s  {nbytes / MB / wall:7.1f} MB/s")
        print(f"  (pull's agent link connect + agent start: {min(pull_conn):.2f} s, the stream's "
              "ssh logins overlapping it)")
        if all(cpus.values()):
            # Both ends share this box's cores: a transfer that keeps them busy goes as fast
            # as its total CPU allows, so this says where a wall ratio can go here.
            print("box CPU per transfer (median; every process and kernel thread, both ends):")
            for name, short, _ in results:
                print(f"  {name:<50} {statistics.median(cpus[short]):6.2f} s  "
                      f"({statistics.median(cpus[short]) / (nbytes / 1e9):.2f} s per GB)")
        pull_s = results[0][2]
        print()
        for _, short, wall in results[1:]:
            print(f"ratio pull/{short}: {wall / pull_s:.2f}x throughput")
        if cpus["pull"] and cpus["rsync"]:
            used = statistics.median(cpus["rsync"]) / statistics.median(cpus["pull"])
            print(f"ratio pull/rsync box CPU: {used:.2f}x (above 1: pull used less)")
        print("target: pull >= 1.0x rsync -a (pull also checks every sha256 and fsyncs every "
              "file; rsync -a --fsync is the like-for-like figure)")
    finally:
        if sshd is not None:
            sshd.kill()
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
