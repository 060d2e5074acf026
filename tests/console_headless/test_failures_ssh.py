"""`fleetdeck failures NODE [--json]` over the real sshd: a supervised run whose simulated
server fails a share of its requests with HTTP 503, asked through the agent link (serve
--stdio relaying to the supervisor, which answers), and a journal larger than one call
reads; judged by failures.jsonl on disk."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec

from agents.engine.journal import Journal, failed, requeued
from agents.rundir.failsummary import MAX_READ_BYTES
from agents.rundir.schema import FailureSummary
from tests.agent.failures_disk import assert_matches_disk, expected
from tests.console_headless.test_headless_ssh import fleetdeck, node_toml
from tests.plugins.supervised import agent, wait_status
from tests.servers.sshd import SshServer


def test_failures_over_ssh_are_the_journal_grouped(sshd: SshServer, supervised,
                                                   tmp_path: Path) -> None:
    run = supervised(2, prompts=300, sim_args="--error-rate 0.2 --error-status 503",
                     retries=1, concurrency_per_server=4)
    assert agent("up", str(run.spec)).returncode == 0
    wait_status(run.run_dir, lambda s: s["status"] == "done", 300, "the run done")
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(node_toml("gen-1", sshd, run.run_dir))

    r = fleetdeck(fleet, "failures", "gen-1", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["node"] == "gen-1"
    got = msgspec.convert(out["failures"], FailureSummary)
    journal = run.run_dir / "failures.jsonl"
    assert got.complete and got.bytes_read == journal.stat().st_size
    assert_matches_disk(got, journal)
    (g,) = got.groups  # every failure here is the simulator's 503
    assert (g.event, g.error) == ("failed", "http_503") and g.count >= 10
    assert {s.server for s in g.servers} == {0, 1}

    r = fleetdeck(fleet, "failures", "gen-1", "--examples", "2")
    assert r.returncode == 0, r.stderr
    head, row, *examples = r.stdout.splitlines()
    count = expected(journal)[("failed", "http_503")]["count"]
    assert head.startswith(f"gen-1: {count:,} failed and 0 requeued in 1 class")
    assert "HTTP 503" in row and f"{count:,}" in row and "servers " in row
    assert len(examples) == 2 and all('"http_503"' in e for e in examples)

    r = fleetdeck(fleet, "failures", "nope")
    assert r.returncode == 2 and "nope" in r.stderr


def test_a_journal_of_many_reads_is_read_through_in_bounded_calls(sshd: SshServer,
                                                                   tmp_path: Path) -> None:
    """A journal of ~2.5 times what one call reads (written by the engine's own journal):
    `fleetdeck failures` asks again until the node has read it all (no supervisor here:
    `serve --stdio` answers from disk, its summary kept for the session)."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "run.toml").write_text('[run]\nname = "big"\n')
    journal = Journal(run_dir / "failures.jsonl")
    journal.recover()
    busy = "The server is busy: the request queue is full, try again later. " * 2
    events, size = [], 0
    while size < 2.5 * MAX_READ_BYTES:
        i = len(events)
        ev = (requeued(i, 1, "deadline", i % 7, "no answer after 96 s") if i % 9 == 0 else
              failed(i, ("http_503", "timeout", "connect")[i % 3], busy, 3, i % 5))
        events.append(ev)
        size += len(msgspec.json.encode(ev)) + 1
    journal.append(events)
    journal.close()
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(node_toml("gen-1", sshd, run_dir))
    r = fleetdeck(fleet, "failures", "gen-1", "--json")
    assert r.returncode == 0, r.stderr
    got = msgspec.convert(json.loads(r.stdout)["failures"], FailureSummary)
    assert got.complete and got.bytes_read == (run_dir / "failures.jsonl").stat().st_size
    assert got.events == len(events) and got.lines == len(events)
    assert_matches_disk(got, run_dir / "failures.jsonl")
