"""Campaign nodes for tests: each a folder with its run.toml (a [queue] section on one shared
prefix), its own simulators and its engine as a real process."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agents.queue.union import Verdict, verify
from tests.engine.runs import EngineProc, start_engine, write_spec
from tests.servers.s3 import S3Server
from tests.simserver import FAST_ARGS, SimHandle, start_sim


@dataclass
class Node:
    name: str
    folder: Path
    spec: Path
    sims: list[SimHandle]
    engine: EngineProc | None = None
    runs: list[EngineProc] = field(default_factory=list)

    @property
    def run_dir(self) -> Path:
        return self.folder / "run"

    def start(self, env: dict[str, str]) -> EngineProc:
        self.engine = start_engine(self.spec, env=env, tag=f"-{self.name}")
        self.runs.append(self.engine)
        return self.engine

    def progress(self) -> dict[str, Any] | None:
        try:
            return json.loads((self.run_dir / "progress.json").read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None

    def logs(self) -> str:
        return "\n".join(f"--- {r.log.name}\n{r.stderr()[-4000:]}" for r in self.runs)

    def stop(self) -> None:
        for r in self.runs:
            r.kill()
        for s in self.sims:
            s.kill()


def prefix_for(root: Path) -> str:
    """A test's own campaign prefix (tests share one SeaweedFS)."""
    return f"campaigns/{root.name}/"


def make_node(root: Path, name: str, prompts: Path, s3: S3Server, sims: int = 2,
              time_scale: float = 0.001, endpoint: str | None = None, lease_s: float = 20.0,
              chunk_size: int = 50, poll_s: float | None = None, seed: int = 0,
              **generate: Any) -> Node:
    """A node's folder, spec and simulators (seeds `seed`, `seed` + 1, ...); not started.
    `poll_s` defaults to an eighth of the lease."""
    folder = root / name
    folder.mkdir(parents=True)
    args = list(FAST_ARGS)
    args[args.index("--time-scale") + 1] = str(time_scale)
    handles = [start_sim(folder, *args, "--seed", str(seed + k), name=f"sim{k}")
               for k in range(sims)]
    spec = write_spec(folder / "run.toml", prompts, [h.url for h in handles], s3=s3,
                      **generate)
    text = spec.read_text().replace('prefix = "runs/test/"', f'prefix = "{prefix_for(root)}"')
    if endpoint is not None:
        text = text.replace(f'endpoint_url = "{s3.endpoint_url}"', f'endpoint_url = "{endpoint}"')
    text = text.replace('name = "test-run"', f'name = "{name}"\ncampaign = "test"')
    text += (f'\n[queue]\nnode = "{name}"\nchunk_size = {chunk_size}\nlease_s = {lease_s}\n'
             f"poll_s = {poll_s if poll_s is not None else max(0.2, lease_s / 8)}\n")
    spec.write_text(text)
    return Node(name, folder, spec, handles)


def check(s3: S3Server, prefix: str, deep: float = 1.0) -> Verdict:
    return verify(s3.client(), s3.bucket, prefix, deep=deep, seed=0)
