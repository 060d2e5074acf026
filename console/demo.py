"""`fleetdeck demo`: a simulated generation node shaped like the reference run, on this machine.

In a temporary folder: 7 simulated SGLang servers (MTP-like accept lengths; GPU 3 crashes
partway so the restart story shows), a synthetic prompt set, S3 on a local SeaweedFS (uploads
off, with a note, where `weed` is missing), a real supervisor and engine; then the TUI on it
through the local transport, or JSON status lines with --headless. Everything it started is
stopped on exit, Ctrl-C included, and a signal during that shutdown (the terminal closed a
second after `q`) hurries it rather than cutting it short; the S3 server also dies with the
demo's process whatever happens to it (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import signal
import stat
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from agents.rundir.spec import load_spec
from agents.supervise.launch import RunCtlError, call, up
from agents.supervise.procinfo import alive, kill_group
from console.fleet import ConsoleSettings, Fleet, Node
from console.localproc import port_block
from console.seaweed import S3Server, WeedMissing, start_s3

GPUS = 7
CRASHING_GPU = 3
TIME_SCALE = 0.2

TOPICS = ["a binary heap", "TCP slow start", "the Krebs cycle", "B-trees", "Raft elections",
          "photosynthesis", "CUDA warps", "the French Revolution", "Bloom filters", "RLHF"]


def write_prompts(path: Path, n: int, seed: int = 0) -> None:
    """ShareGPT lines like the reference set: 12.5% with tools, 8.4% multi-turn."""
    rng = random.Random(seed)
    tool = {"type": "function", "function": {"name": "search", "description": "web search",
                                             "parameters": {"type": "object", "properties": {
                                                 "q": {"type": "string"}}}}}
    with open(path, "w") as f:
        for i in range(n):
            topic = rng.choice(TOPICS)
            turns = [{"from": "human", "value": f"Explain {topic} step by step ({i})."}]
            if rng.random() < 0.084:
                turns += [{"from": "gpt", "value": f"{topic} is a large subject."},
                          {"from": "human", "value": "Go deeper, with an example."}]
            obj: dict[str, Any] = {"id": f"demo-{i}", "conversations": turns}
            if rng.random() < 0.125:
                obj["tools"] = [tool]
            f.write(json.dumps(obj) + "\n")


def write_launcher(folder: Path) -> Path:
    """The servers' command: a simulator per GPU; the crashing GPU dies once, then behaves."""
    script = folder / "demo_server.sh"
    script.write_text(f"""#!/bin/sh
# fleetdeck demo: one simulated SGLang server. Arguments: PORT GPU
port=$1; gpu=$2
extra=""
if [ "$gpu" = "{CRASHING_GPU}" ] && [ ! -e "{folder}/crashed-once" ]; then
  touch "{folder}/crashed-once"; extra="--crash-after-seconds 250"
fi
accept=$(awk "BEGIN {{ print 2.7 + 0.08 * $gpu }}")
exec {sys.executable} -m agents.sim --port "$port" --model-path Qwen3.6-27B-sim \\
  --time-scale {TIME_SCALE} --load-seconds 15 --enable-metrics --accept-length "$accept" \\
  --truncation-share 0.12 --seed "$gpu" $extra
""")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def write_spec(folder: Path, prompts: int, s3: S3Server | None) -> Path:
    write_prompts(folder / "prompts.jsonl", prompts)
    launcher = write_launcher(folder)
    lines = [
        "[run]", 'name = "demo-qwen-traces"', 'kind = "generate"', 'dir = "run"', "",
        "[servers]", f"gpus = {list(range(GPUS))}", f"base_port = {port_block(GPUS)}",
        'model = "Qwen3.6-27B-sim"', f'command = "{launcher} {{port}} {{gpu}}"',
        "startup_timeout_s = 120", "restart_backoff_s = 3", "health_interval_s = 1", "",
        "[generate]", 'prompts = "prompts.jsonl"', "max_tokens = 4096",
        "concurrency_per_server = 40", "batch_size = 500", "retries = 3",
        "request_timeout_s = 600", "",
        "[generate.sampling]", "temperature = 0.6", "top_p = 0.95", "",
        "[generate.chat_template_kwargs]", "enable_thinking = true",
    ]
    if s3 is not None:
        lines += ["", "[s3]", f'bucket = "{s3.bucket}"', 'prefix = "demo/"',
                  f'endpoint_url = "{s3.endpoint_url}"', 'region = "us-east-1"']
    spec = folder / "run.toml"
    spec.write_text("\n".join(lines) + "\n")
    return spec


class Demo:
    def __init__(self, prompts: int) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="fleetdeck-demo-"))
        self.prompts = prompts
        self.s3: S3Server | None = None
        self.run_dir = self.folder / "run"
        self.note: str | None = None

    def start(self) -> Fleet:
        try:
            self.s3 = start_s3(self.folder / "s3", bucket="fleetdeck-demo")
            os.environ.update(self.s3.env())
        except (WeedMissing, RuntimeError, TimeoutError) as exc:
            self.note = f"S3 uploads are off in this demo: {exc}"
            print(f"fleetdeck demo: {self.note}", file=sys.stderr)
        spec = load_spec(write_spec(self.folder, self.prompts, self.s3))
        asyncio.run(up(spec))
        node = Node(name="demo-gen", run_dir=str(self.run_dir), role="generate", local=True,
                    agent=f"{sys.executable} -m agents.cli", spec=str(spec.source))
        return Fleet(nodes=[node], console=ConsoleSettings(), source="(demo)")

    def stop(self) -> None:
        """Stop everything the demo started; safe to call again. A signal meanwhile (the
        terminal closed a second after `q`, a second Ctrl-C) cuts the waiting short, never
        the cleanup: whatever still lives is killed, S3 included, and the folder removed."""
        self._final = False

        def hurry(signum: int, frame: object) -> None:
            if not self._final:
                raise _Hurry(f"signal {signum}")

        for sig in SIGNALS:
            signal.signal(sig, hurry)
        # Textual's driver leaves its SIGCONT/SIGTSTP handlers behind after the app ends; a
        # hangup comes with a SIGCONT, and that handler then raises (no event loop) in the
        # middle of this cleanup. Nothing is left to resume or suspend: the defaults.
        for sig in (signal.SIGCONT, signal.SIGTSTP):
            signal.signal(sig, signal.SIG_DFL)
        try:
            try:
                print("fleetdeck demo: stopping everything it started", file=sys.stderr)
            except OSError:
                pass  # the terminal is gone (SIGHUP): clean up all the same
            self._stop_gently()
        except _Hurry:
            pass  # a signal: kill what is left now
        while True:
            try:
                self._final = True  # from here on signals change nothing
                self._kill_the_rest()
                return
            except _Hurry:
                continue  # landed before the line above took effect: once more

    def _pids(self) -> list[int]:
        pids: list[int] = []
        try:
            pids.append(int((self.run_dir / "supervisor.pid").read_text()))
        except (OSError, ValueError):
            pass
        try:
            pids += [s["pid"] for s in json.loads((self.run_dir / "servers.json").read_text())
                     if s.get("pid")]
        except (OSError, ValueError):
            pass
        return pids

    def _stop_gently(self) -> None:
        """`down` through the supervisor, then up to 20 s for its processes to end."""
        self._started_pids = set(self._pids()) | getattr(self, "_started_pids", set())
        try:
            asyncio.run(call(self.run_dir, "down", {"who": "demo"}))
        except (RunCtlError, OSError, ConnectionError):
            pass
        deadline = time.monotonic() + 20
        while any(alive(p) for p in self._started_pids) and time.monotonic() < deadline:
            time.sleep(0.1)

    def _kill_the_rest(self) -> None:
        """Quick and idempotent: SIGKILL whatever still lives, S3, the folder."""
        for pid in set(self._pids()) | getattr(self, "_started_pids", set()):
            if alive(pid):
                kill_group(pid, signal.SIGKILL)
        if self.s3 is not None:
            self.s3.kill()
        shutil.rmtree(self.folder, ignore_errors=True)


def headless(fleet: Fleet, duration: float) -> None:
    from console.transport import AgentLink

    async def loop() -> None:
        link = AgentLink(fleet.nodes[0])
        await link.connect()
        deadline = time.monotonic() + duration
        try:
            while time.monotonic() < deadline:
                snap = await link.call("status", {}, timeout=30)
                print(json.dumps(snap), flush=True)
                await asyncio.sleep(1.0)
        finally:
            await link.close()

    asyncio.run(loop())


SIGNALS = (signal.SIGHUP, signal.SIGTERM, signal.SIGINT)


class _Hurry(KeyboardInterrupt):
    """A signal while the demo shuts down: stop waiting, kill what is left."""


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def run_demo(args: argparse.Namespace) -> int:
    demo = Demo(args.prompts)
    # SIGTERM, and SIGHUP (the terminal or the SSH session closed), end the demo like Ctrl-C
    # does: through the cleanup below, never leaving servers behind.
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _interrupt)
    try:
        fleet = demo.start()
        print(f"fleetdeck demo: a simulated {GPUS}-GPU node in {demo.folder}", file=sys.stderr)
        if args.headless:
            headless(fleet, args.duration if args.duration is not None else 30.0)
        else:
            from console.tui.main import FleetdeckApp

            app = FleetdeckApp(fleet, note=demo.note, exit_after=args.duration)
            app.run()
        return 0
    except KeyboardInterrupt:
        return 130
    except RunCtlError as exc:
        print(f"fleetdeck demo: {exc}", file=sys.stderr)
        return 1
    finally:
        while True:
            try:
                demo.stop()
                break
            except KeyboardInterrupt:
                continue  # a signal landed before stop() took them over: stop again
