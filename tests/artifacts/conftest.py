"""One real run for the artifact tests: the engine against a simulator, uploading to a real
S3, made once per package; each test works on its own copy of the run directory. The S3
server is the package's too (`shared_s3`), for tests that make runs of their own."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from agents.engine.uploader import sha256_b64
from tests.engine.runs import start_engine, write_prompts, write_spec
from tests.servers.ports import kill_pid
from tests.servers.s3 import S3Server, running_s3
from tests.simserver import FAST_ARGS, start_sim

PROMPTS = 300
BATCH_SIZE = 40
BAD_EVERY = 100  # indices 99, 199, 299 are malformed prompts: failed, no line


@dataclass
class MadeRun:
    run_dir: Path
    s3: S3Server
    bad: set[int]


@pytest.fixture(scope="package")
def shared_s3() -> Iterator[S3Server]:
    with running_s3() as s3:
        yield s3


@pytest.fixture(scope="package")
def made_run(tmp_path_factory: pytest.TempPathFactory, shared_s3: S3Server) -> MadeRun:
    root = tmp_path_factory.mktemp("made")
    s3 = shared_s3
    (root / "sim").mkdir()
    sim = start_sim(root / "sim", *FAST_ARGS, "--seed", "7")
    try:
        prompts = root / "prompts.jsonl"
        bad = write_prompts(prompts, PROMPTS, bad_every=BAD_EVERY)
        spec = write_spec(root / "run.toml", prompts, [sim.url], s3=s3, batch_size=BATCH_SIZE)
        engine = start_engine(spec, env=s3.env())
        assert engine.wait(300) == 0, engine.stderr()
    finally:
        kill_pid(sim.proc)
    progress = json.loads((engine.run_dir / "progress.json").read_text())
    assert progress["status"] == "done" and progress["s3_pending"] == 0, progress
    return MadeRun(engine.run_dir, s3, bad)


@pytest.fixture
def run_copy(made_run: MadeRun, tmp_path: Path) -> Path:
    """The made run, copied with its mtimes; S3 is shared (read it, do not change it)."""
    dest = tmp_path / "run"
    shutil.copytree(made_run.run_dir, dest, symlinks=True)
    return dest


@pytest.fixture
def s3_env(made_run: MadeRun, monkeypatch: pytest.MonkeyPatch) -> S3Server:
    """The S3 credentials in this process's environment, as on a node."""
    for key, value in made_run.s3.env().items():
        monkeypatch.setenv(key, value)
    return made_run.s3


def own_prefix(run_dir: Path, s3: S3Server, name: str) -> str:
    """Give a copied run its own S3 prefix (the same objects, uploaded again from the local
    batches with their SHA-256 checksums, as the engine does), so that a test may damage
    them."""
    client = s3.client()
    prefix = f"runs/{name}/"
    records = [json.loads(x) for x in (run_dir / "uploads.jsonl").read_text().splitlines()]
    for rec in records:
        rec["key"] = prefix + rec["batch"]
        client.put_object(Bucket=rec["bucket"], Key=rec["key"],
                          Body=(run_dir / "completions" / rec["batch"]).read_bytes(),
                          ChecksumAlgorithm="SHA256", ChecksumSHA256=sha256_b64(rec["sha256"]))
    (run_dir / "uploads.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    spec = run_dir / "run.toml"
    spec.write_text(re.sub(r'(?m)^prefix = ".*"$', f'prefix = "{prefix}"', spec.read_text()))
    return prefix


def batch_indices(path: Path) -> list[int]:
    return sorted(json.loads(line)["index"] for line in path.read_text().splitlines())
