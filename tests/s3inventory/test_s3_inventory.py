"""`fleetdeck s3-inventory` on SeaweedFS: a real run uploads its batches, pin and journals, and
is pulled here; beside it, prefixes no run the console knows wrote (a stray folder, one
planted inside the runs' folder, an old run's pin and batch). Sizes, counts and costs are
checked against S3's own listing."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from console.s3inventory import GB, S3_STANDARD_GB_MONTH
from console.seaweed import S3Server
from tests.engine.runs import start_engine, write_prompts, write_spec
from tests.plugins.sims import FAST
from tests.servers.ports import kill_pid
from tests.simserver import start_sim


def inventory(s3: S3Server, home: Path, *args: str,
              env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, **s3.env(), "HOME": str(home), **(env or {})}
    return subprocess.run([sys.executable, "-m", "console.cli", "s3-inventory", *args,
                           "--endpoint-url", s3.endpoint_url], capture_output=True, text=True,
                          env=full, timeout=300)


def listing(s3: S3Server) -> dict[str, int]:
    out: dict[str, int] = {}
    for page in s3.client().get_paginator("list_objects_v2").paginate(Bucket=s3.bucket):
        out.update({o["Key"]: o["Size"] for o in page.get("Contents", [])})
    return out


def uploaded_run(s3: S3Server, root: Path) -> Path:
    """A finished run whose batches are in S3 under runs/test/ (write_spec's prefix)."""
    sim = start_sim(root, *FAST)
    try:
        prompts = root / "prompts.jsonl"
        write_prompts(prompts, 60)
        spec = write_spec(root / "run.toml", prompts, [sim.url], s3=s3, batch_size=20)
        engine = start_engine(spec, env=s3.env())
        assert engine.wait(300) == 0, engine.stderr()
    finally:
        kill_pid(sim.proc)
    return engine.run_dir


def test_a_planted_prefix_is_stale_and_the_pulled_run_is_known(
        s3: S3Server, tmp_path: Path) -> None:
    run_dir = uploaded_run(s3, tmp_path)
    pulls = tmp_path / "pulls"
    shutil.copytree(run_dir, pulls / "gen-1" / "test-run")
    client = s3.client()
    client.put_object(Bucket=s3.bucket, Key="planted/a.jsonl", Body=b"x" * 300_000)
    client.put_object(Bucket=s3.bucket, Key="planted/deep/b.jsonl", Body=b"y" * 5_000)
    client.put_object(Bucket=s3.bucket, Key="runs/forgotten/completions_000000.jsonl",
                      Body=b"z" * 70_000)
    client.put_object(Bucket=s3.bucket, Key="old/journals/run/run.pin.json", Body=b"{}")
    client.put_object(Bucket=s3.bucket, Key="old/completions_000000.jsonl", Body=b"w" * 9_000)

    done = inventory(s3, tmp_path, f"s3://{s3.bucket}", "--pulls", str(pulls), "--json")
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    rows = {r["prefix"]: r for r in got["prefixes"]}
    assert set(rows) == {"runs/test/", "runs/forgotten/", "planted/", "old/"}

    keys = listing(s3)
    for prefix, row in rows.items():
        mine = {k: v for k, v in keys.items() if k.startswith(prefix)}
        assert row["bytes"] == sum(mine.values()) and row["objects"] == len(mine), prefix
        assert abs(row["monthly_usd"] - row["bytes"] / GB * S3_STANDARD_GB_MONTH) < 1e-12
    assert rows["runs/test/"]["known"] and not rows["runs/test/"]["stale"]
    assert rows["runs/test/"]["written_by"] == [
        "gen-1/test-run (its run.toml [s3] and its upload records)"]
    assert rows["runs/test/"]["pinned"] == "run"
    for stray in ("runs/forgotten/", "planted/", "old/"):
        assert rows[stray]["stale"] and rows[stray]["written_by"] == [], stray
    assert rows["old/"]["pinned"] == "run"  # a run's pin, but no run the console knows
    assert got["price"] == "S3 Standard" and got["price_gb_month"] == 0.023
    assert [r["bytes"] for r in got["prefixes"]] == sorted((r["bytes"] for r in
                                                            got["prefixes"]), reverse=True)

    # Not pulled: nothing is known, so the run's own prefix is stale too (and said recent).
    done = inventory(s3, tmp_path, f"s3://{s3.bucket}/runs", "--price-gb-month", "0.0125")
    assert done.returncode == 0, done.stderr
    text = done.stdout
    assert "at $0.0125/GB-month (given with --price-gb-month)" in text
    lines = {line.split()[0]: line for line in text.splitlines()[2:]}
    assert set(lines) == {"runs/test/", "runs/forgotten/"}
    assert "stale: no known run wrote it" in lines["runs/test/"]
    assert "a live run not pulled yet?" in lines["runs/test/"]


def test_bad_targets_and_refused_keys_are_named(s3: S3Server, tmp_path: Path) -> None:
    done = inventory(s3, tmp_path, "gs://bucket")
    assert done.returncode == 2 and "give s3://BUCKET or s3://BUCKET/PREFIX" in done.stderr
    done = inventory(s3, tmp_path, f"s3://{s3.bucket}", "--price-gb-month", "-1")
    assert done.returncode == 2 and "--price-gb-month -1.0" in done.stderr
    done = inventory(s3, tmp_path, f"s3://{s3.bucket}",
                     env={"AWS_SECRET_ACCESS_KEY": "wrong"})
    assert done.returncode == 3
    assert f"s3://{s3.bucket}/ at {s3.endpoint_url}" in done.stderr
    assert "wrong" not in done.stderr
