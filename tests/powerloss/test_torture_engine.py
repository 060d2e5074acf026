"""Power-loss torture of the engine at a smoke size (benchmarks/powerloss.py runs it at full
size): one recording on simulators, cut at every kind of crash point and at random moments,
recovery alone on each; then a live cut at the upload crash point with a real S3."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.powerloss.harness import ForgetfulDir
from tests.powerloss.torture import engine
from tests.servers.ports import kill_pid
from tests.servers.s3 import S3Server
from tests.simserver import FAST_ARGS, start_sim


def test_engine_power_cut_at_every_crash_point(forgetful_dir: ForgetfulDir,
                                               tmp_path: Path) -> None:
    fig = engine.torture(forgetful_dir, tmp_path, cuts=30, seed=3, per_kind=3)
    print(fig.line(), *fig.notes, sep="\n")
    kinds = set(fig.by_kind)
    # The recording passes every crash point a run without S3 has: one cut at each, at least.
    assert {"lines_written", "lines_fsynced", "batch_close", "random"} <= kinds, kinds
    assert fig.cuts >= 25 and fig.kept["lines kept"] > 0


def test_engine_power_cut_live_at_the_upload_crash_point(forgetful_dir: ForgetfulDir,
                                                          tmp_path: Path,
                                                          s3: S3Server) -> None:
    """Killed between an object's put and its record in uploads.jsonl, then the power cut:
    the resume uploads the batch again, records it once, and verify (S3 included) is green."""
    sim = start_sim(tmp_path, *FAST_ARGS, "--time-scale", "0.01")
    try:
        spec = _s3_run(tmp_path, forgetful_dir, sim.url, s3, "runs/pl/")
        env = {**engine.engine_env(forgetful_dir), **s3.env()}
        found = engine.live_cut(forgetful_dir, tmp_path, spec, env, crash_at="upload:2")
    finally:
        kill_pid(sim.proc)
    uploads = [json.loads(x)["batch"] for x in
               (forgetful_dir / "run" / "uploads.jsonl").read_text().splitlines()]
    assert len(uploads) == len(set(uploads)) == 6, uploads  # 120 lines in batches of 20
    assert found["resumed to"] == 120


@pytest.mark.parametrize("crash_at", ["queue_claim:2", "queue_commit:1", "queue_commit:3"])
def test_a_campaign_node_power_cut_live_at_the_queue_crash_points(
        forgetful_dir: ForgetfulDir, tmp_path: Path, s3: S3Server, crash_at: str) -> None:
    """A campaign node killed at a chunk's claim (its lease created, not yet journaled here)
    or at its commit (created in S3, its outcome not journaled), then the power cut: the
    resume takes up its chunks again, commits each chunk once, and the campaign's proof from
    its commits is green."""
    from agents.queue.union import verify

    sim = start_sim(tmp_path, *FAST_ARGS, "--time-scale", "0.01")
    try:
        prefix = f"campaigns/pl-{crash_at.replace(':', '-')}/"
        spec = _s3_run(tmp_path, forgetful_dir, sim.url, s3, prefix,
                       '\n[queue]\nnode = "pl"\nchunk_size = 30\nlease_s = 20\npoll_s = 0.5\n')
        env = {**engine.engine_env(forgetful_dir), **s3.env()}
        found = engine.live_cut(forgetful_dir, tmp_path, spec, env, crash_at=crash_at)
    finally:
        kill_pid(sim.proc)
    v = verify(s3.client(), s3.bucket, prefix, deep=1.0)
    assert v.ok and v.committed == v.chunks == 4 and v.done + v.failed == 120, v.problems
    assert found["resumed to"] == 120
    # Every commit is this node's, the one whose outcome the cut took among them; the
    # campaign's lines, counted from the commit objects, are all its own.
    q = json.loads((forgetful_dir / "run" / "progress.json").read_text())["queue"]
    assert (q["committed_here"], q["lost"], q["lost_lines"], q["commits_counted"]) == \
        (4, 0, 0, 4), q
    assert (q["lines_done"], q["lines_failed"]) == (v.done, v.failed) == \
        (q["done_here"], q["failed_here"]), q


def _s3_run(root: Path, fs: ForgetfulDir, url: str, s3: S3Server, prefix: str,
            extra: str = "") -> Path:
    """120 prompts and a run.toml whose run dir is on the forgetful mount, with [s3]."""
    (root / "prompts.jsonl").write_text("".join(
        json.dumps({"messages": [{"role": "user", "content": f"q {i}"}]}) + "\n"
        for i in range(120)))
    spec = engine.write_engine_spec(root / "run.toml", root / "prompts.jsonl", fs / "run", [url])
    spec.write_text(spec.read_text() + f'\n[s3]\nbucket = "{s3.bucket}"\nprefix = "{prefix}"\n'
                    f'endpoint_url = "{s3.endpoint_url}"\nregion = "us-east-1"\n' + extra)
    return spec
