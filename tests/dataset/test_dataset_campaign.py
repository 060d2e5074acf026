"""A campaign's dataset card, from what its prefix holds beside the commits (the real
SeaweedFS): each failed index's class from the journal of the node whose commit failed it
(`journals/NODE/RUN_ID/failures.jsonl`), one its journal does not explain named so, a missed
deadline's retry counted for the line it made, the wall time from the commits, GPU-hours and
cost from a node's pulled copy, and each node's provenance.json (the first in full, a node
that differs named). The S3 prefix comes from the fleet file's [[campaigns]] table; a
journal line that is not an event is refused by its key and line."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from agents.queue import records as rec
from agents.queue import s3ops
from agents.queue.layout import Layout
from agents.queue.ranges import to_ranges
from tests.dataset.test_dataset import FLEETDECK, env, load_both
from tests.servers.s3 import S3Server, running_s3
from tests.trainer.test_campaign_source import Campaign, line

LINES, CHUNK = 20, 10
T0 = 1_700_000_000.0


def prov(version: str) -> dict[str, Any]:
    return {"v": 1, "captures": [{
        "captured_at": T0, "model": "tiny", "model_dir": "/m", "model_files":
        {"config.json": "cd" * 32}, "model_files_note": None, "sglang_version": version,
        "server_args": {"tp_size": 1}, "launch_command": "python -m sglang.launch_server",
        "sampling": {}, "chat_template_kwargs": {}, "reasoning_parser": "qwen3",
        "max_tokens": 4096}]}


def event(kind: str, i: int, **more: Any) -> dict[str, Any]:
    return {"event": kind, "time": T0, "index": i, "attempt": 1, "server": 0, **more}


def jsonl(rows: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in rows)


def build(s3: S3Server, recorded_as: dict[str, str] | None = None) -> Campaign:
    """Node a committed chunk 0 (8 and 9 failed, its journal says why); node b chunk 1 (19
    failed, its journal silent on it; 12 answered after a missed deadline). `recorded_as`:
    the node name a node's commit record says instead of its own (a hostile record)."""
    c = Campaign(s3, "camps/card/")
    client, layout = s3.client(), Layout(c.prefix)
    pin = rec.CampaignPin(campaign="tq", prompts_sha256="ab" * 32, prompts_lines=LINES,
                          chunk_size=CHUNK, model="tiny", sampling={}, chat_template_kwargs={},
                          created_at=T0, created_by="a")
    assert s3ops.create(client, s3.bucket, layout.pin, rec.encode(pin))
    spans = {"a": (T0, T0 + 1800), "b": (T0 + 600, T0 + 7200)}
    for node, chunk, failed in (("a", 0, (8, 9)), ("b", 1, (19,))):
        done = [i for i in range(chunk * CHUNK, chunk * CHUNK + CHUNK) if i not in failed]
        part = c.batch(node, 0, [line(i, node) for i in done], committed=done)
        commit = rec.Commit(generation=0, chunk=chunk, node=(recorded_as or {}).get(node, node),
                            run_id="r" + node, epoch=1,
                            started_at=spans[node][0], committed_at=spans[node][1],
                            done=to_ranges(done), failed=to_ranges(failed), truncated=[],
                            batches=[part], attempt=1)
        assert s3ops.create(client, s3.bucket, layout.commit(0, chunk), rec.encode(commit))
        c.put(layout.journal(node, "r" + node, "provenance.json"),
              json.dumps(prov("0.5.6" if node == "a" else "0.5.7")).encode())
    c.put(layout.journal("a", "ra", "failures.jsonl"), jsonl([
        event("failed", 8, error="http_500", message="Internal Server Error", attempts=3),
        event("failed", 9, error="deadline", message="deadline missed", attempts=3)]))
    c.put(layout.journal("b", "rb", "failures.jsonl"), jsonl([
        event("requeued", 12, what="deadline", message="deadline 30 s missed")]))
    return c


def fleet_file(tmp: Path, c: Campaign) -> Path:
    path = tmp / "fleet.toml"
    path.write_text(f'[console]\npull_dir = "{tmp / "pulls"}"\n\n'
                    '[[nodes]]\nname = "a"\nlocal = true\nrun_dir = "/x"\n'
                    '[[nodes]]\nname = "b"\nlocal = true\nrun_dir = "/y"\n'
                    f'[[campaigns]]\nname = "tq"\nnodes = ["a", "b"]\ns3 = "{c.url}"\n'
                    f'endpoint_url = "{c.s3.endpoint_url}"\n')
    return path


def pulled_copy_of_a(tmp: Path) -> None:
    """Node a's run as `fleetdeck pull` leaves it: its run id and its progress."""
    copy = tmp / "pulls" / "a" / "tq-run"
    (copy / "queue").mkdir(parents=True)
    (copy / "queue" / "member.json").write_text(json.dumps({"run_id": "ra", "node": "a"}))
    (copy / "progress.json").write_text(json.dumps({
        "gpu_hours": 4.0, "gpus": 8, "cost": {"per_gpu_hour": 2.49, "usd": 9.96,
                                              "per_mtok_usd": None, "projected_usd": None}}))


def run(fleet: Path, s3: S3Server, tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*FLEETDECK, "--fleet", str(fleet), "dataset", "tq", *args],
                          capture_output=True, text=True, timeout=600,
                          env={**env(tmp), **s3.env()})


def test_a_campaign_card_says_failures_time_cost_and_each_nodes_provenance(
        tmp_path: Path) -> None:
    out = tmp_path / "ds"
    with running_s3() as s3:
        c = build(s3)
        fleet = fleet_file(tmp_path, c)
        pulled_copy_of_a(tmp_path)
        got = run(fleet, s3, tmp_path, "--to", str(out))  # no --from: the fleet file's s3
        assert got.returncode == 0, got.stderr
        summary = json.loads(got.stdout.strip().splitlines()[-1])
        assert (summary["rows"], summary["failed"]) == (17, 3)

        # A journal line that is not an event: refused by its key and line, nothing written.
        c.put(Layout(c.prefix).journal("b", "rb", "failures.jsonl"),
              jsonl([event("requeued", 12, what="deadline")]) + b'{"event": oops\n')
        bad = run(fleet, s3, tmp_path, "--to", str(tmp_path / "bad"))
        assert bad.returncode == 1
        assert f"{c.url}journals/b/rb/failures.jsonl:2: unreadable journal line" in bad.stderr
        assert not (tmp_path / "bad").exists()

    fails = [json.loads(x) for x in (out / "failures.jsonl").read_text().splitlines()]
    assert [(f["index"], f["error"]) for f in fails] == [
        (8, "http_500"), (9, "deadline"), (19, "unknown (not in its node's journal)")]
    card = (out / "README.md").read_text()
    assert "| http_500 | 1 |" in card and "| deadline | 1 |" in card
    assert "| unknown (not in its node's journal) | 1 |" in card
    assert "| sent again after a missed deadline | 1 |" in card, "12's line, made by b"
    assert "- wall time: 2.00 h, from the first chunk's start to the last commit" in card
    assert "- GPU-hours: 4.00 over 1 of 2 node run(s) (from their pulled copies)" in card
    assert "- cost: $9.96 over 1 of 2 node run(s)" in card
    assert "| a | ra | 1 | 0.50 h | 4.00 | $9.96 | - |" in card
    assert "| b | rb | 1 | 1.83 h | - | - | - |" in card
    assert "SGLang: `0.5.6`" in card and "as captured on a (ra)" in card
    assert "**b differs** in sglang_version" in card
    every = json.loads((out / "provenance.json").read_text())["nodes"]
    assert [every["a/ra"]["captures"][0]["sglang_version"],
            every["b/rb"]["captures"][0]["sglang_version"]] == ["0.5.6", "0.5.7"]
    loaded = load_both(out, tmp_path)
    assert sorted(r["index"] for r in loaded["rows"]) == \
        [i for i in range(LINES) if i not in (8, 9, 19)]


def test_a_commit_whose_node_is_a_path_is_refused_naming_the_record(tmp_path: Path) -> None:
    """A commit's node becomes a folder name here (PULL_DIR/NODE for its pulled copy): one
    naming "../.." would send the console's reads outside the pull dir."""
    out = tmp_path / "pulls" / "sub" / "ds"
    with running_s3() as s3:
        c = build(s3, recorded_as={"a": "../.."})
        fleet = fleet_file(tmp_path, c)
        got = run(fleet, s3, tmp_path, "--to", str(out))
    assert got.returncode == 1, got.stderr
    assert f"{c.url}commits/gen-0000/" in got.stderr, got.stderr
    assert "node '../..' holds '/' (one folder name, not a path)" in got.stderr, got.stderr
    assert not out.exists()


def test_a_campaign_without_s3_in_the_fleet_file_or_from_says_what_to_set(
        tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.toml"
    fleet.write_text('[[nodes]]\nname = "a"\nlocal = true\nrun_dir = "/x"\n'
                     '[[campaigns]]\nname = "tq"\nnodes = ["a"]\n')
    got = subprocess.run([*FLEETDECK, "--fleet", str(fleet), "dataset", "tq", "--to",
                          str(tmp_path / "ds")], capture_output=True, text=True, timeout=600,
                         env=env(tmp_path))
    assert got.returncode == 2
    assert "give --from s3://BUCKET/PREFIX" in got.stderr and \
        'set s3 = "s3://BUCKET/PREFIX" (and endpoint_url) in its [[campaigns]] table' \
        in got.stderr
    fleet.write_text(fleet.read_text() + 's3 = "bucket-without-scheme/x"\n')
    got = subprocess.run([*FLEETDECK, "--fleet", str(fleet), "dataset", "tq", "--to",
                          str(tmp_path / "ds")], capture_output=True, text=True, timeout=600,
                         env=env(tmp_path))
    assert got.returncode == 2
    assert "campaign 'tq' (campaigns[0]): key s3: 'bucket-without-scheme/x' is not " \
        "s3://BUCKET/PREFIX" in got.stderr
