"""The trainer reads a campaign through its commits, against the real SeaweedFS: a campaign
prefix built by hand with the queue's records, where node a's batches also hold lines of
chunks node b committed (a zombie's), a batch of a's and a losing backup's batch of b's are
named by no commit, and generation 1 redid three indices at attempt 2. Only the committed
lines come out, each index once; a batch whose bytes are not its commit's is refused by
name; a pulled copy reads the same; a plain prefix reads as before."""

from __future__ import annotations

import hashlib
import json
import re
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from agents.queue import records as rec
from agents.queue import s3ops
from agents.queue.layout import Layout
from agents.queue.ranges import to_ranges
from tests.servers.s3 import S3Server, running_s3
from tests.trainer.conftest import cli
from tests.trainer.tinyworld import WORDS, World, batch_line, write_spec
from trainer.campaign import CampaignSource
from trainer.sources import BatchFolder, ReadStats, SourceError, current_lines, open_source

LINES, CHUNK = 30, 10
RETRIED = (3, 21, 22)  # cut at max_tokens in generation 0, redone by generation 1


@pytest.fixture(scope="module")
def store() -> Iterator[S3Server]:
    """One SeaweedFS for this module; each test builds its campaign under a prefix of its own."""
    with running_s3() as s3:
        yield s3


def line(i: int, who: str, attempt: int = 1, finish: str = "stop") -> dict[str, Any]:
    # Long enough to pass prepare's gate; `who` says which node and generation wrote it.
    answer = f"{who} {i:02d} " + " ".join(WORDS[(i + k) % len(WORDS)] for k in range(40))
    msgs = [{"role": "user", "content": f"repeat {WORDS[i % len(WORDS)]}"}]
    return batch_line(i, msgs, answer, finish, attempt=attempt)


def body(lines: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(ln).encode() + b"\n" for ln in lines)


@dataclass
class Campaign:
    s3: S3Server
    prefix: str

    @property
    def url(self) -> str:
        return f"s3://{self.s3.bucket}/{self.prefix}"

    def key(self, node: str, n: int) -> str:
        return f"{Layout(self.prefix).batches(node, 'r' + node)}completions_{n:06d}.jsonl"

    def put(self, key: str, data: bytes) -> None:
        self.s3.client().put_object(Bucket=self.s3.bucket, Key=key, Body=data)

    def batch(self, node: str, n: int, lines: list[dict[str, Any]],
              committed: list[int] | None = None) -> rec.BatchPart:
        """A batch object, and (for a commit) the part naming `committed` of its indices."""
        data = body(lines)
        self.put(self.key(node, n), data)
        return rec.BatchPart(key=self.key(node, n), sha256=hashlib.sha256(data).hexdigest(),
                             size=len(data), indices=to_ranges(committed or []))

    def commit(self, g: int, n: int, node: str, parts: list[rec.BatchPart],
               truncated: tuple[int, ...] = (), epoch: int = 1) -> None:
        done = to_ranges(i for p in parts for s, e in p.indices for i in range(s, e))
        c = rec.Commit(generation=g, chunk=n, node=node, run_id="r" + node, epoch=epoch,
                       started_at=time.time(), committed_at=time.time(), done=done, failed=[],
                       truncated=to_ranges(truncated), batches=parts, attempt=g + 1)
        key = Layout(self.prefix).commit(g, n)
        assert s3ops.create(self.s3.client(), self.s3.bucket, key, rec.encode(c)) is not None


def build(s3: S3Server, retry_committed: bool = True) -> Campaign:
    c = Campaign(s3, f"camps/{uuid.uuid4().hex[:8]}/")
    client = s3.client()
    pin = rec.CampaignPin(campaign="tq", prompts_sha256="ab" * 32, prompts_lines=LINES,
                          chunk_size=CHUNK, model="tiny", sampling={}, chat_template_kwargs={},
                          created_at=time.time(), created_by="a")
    assert s3ops.create(client, s3.bucket, Layout(c.prefix).pin, rec.encode(pin))
    cut = {3, 21, 22}
    # Node a: chunk 0, then its lease ran out mid chunk 1 and it went on as a zombie; node b
    # took chunk 1 over and committed it. a's batch 0 is named (for 0-9) and holds 10-14 too.
    a0 = c.batch("a", 0, [line(i, "a0", finish="length" if i in cut else "stop")
                          for i in range(10)] + [line(i, "zombie") for i in range(10, 15)],
                 committed=list(range(10)))
    c.batch("a", 1, [line(i, "zombie") for i in range(15, 20)])
    c.commit(0, 0, "a", [a0], truncated=(3,))
    b0 = c.batch("b", 0, [line(i, "b0") for i in range(10, 20)], committed=list(range(10, 20)))
    c.commit(0, 1, "b", [b0], epoch=2)
    b1 = c.batch("b", 1, [line(i, "b0", finish="length" if i in cut else "stop")
                          for i in range(20, 30)], committed=list(range(20, 30)))
    c.commit(0, 2, "b", [b1], truncated=(21, 22))
    # Generation 1: the truncated ones again at attempt 2; a commits first, b's backup loses.
    # a's batch also got one more late line of its lost chunk 2 (22 at attempt 1), first.
    gen = rec.Generation(generation=1, why="truncated", chunks=[to_ranges(RETRIED)],
                         max_tokens=8192, created_at=time.time(), created_by="console")
    assert s3ops.create(client, s3.bucket, Layout(c.prefix).gen_record(1), rec.encode(gen))
    a2 = c.batch("a", 2, [line(22, "zombie")] + [line(i, "a1", attempt=2) for i in RETRIED],
                 committed=list(RETRIED))
    if retry_committed:
        c.commit(1, 0, "a", [a2])
    c.batch("b", 2, [line(i, "backup", attempt=2) for i in RETRIED])
    return c


def committed_answers() -> dict[int, str]:
    want = {i: "a0" for i in range(10)} | {i: "b0" for i in range(10, 30)}
    return want | {i: "a1" for i in RETRIED}


def read(source: Any) -> tuple[dict[int, str], ReadStats, list[int]]:
    stats = ReadStats()
    order = []
    got = {}
    for _, ln in source.lines(stats):
        order.append(ln.index)
        got[ln.index] = (ln.content or "").split()[0]
    return got, stats, order


def test_a_campaign_yields_exactly_its_committed_lines(store: S3Server, tmp_path: Path) -> None:
    c = build(store)
    client = store.client()
    source = open_source(c.url, tmp_path / "prepared", client=client)
    assert isinstance(source, CampaignSource)
    got, stats, order = read(source)
    assert sorted(order) == list(range(LINES)), "every index once"
    assert got == committed_answers(), "zombie and backup lines out, generation 1's win"
    assert (stats.lines, stats.superseded, stats.left_out, stats.bad) == (39, 3, 6, 0)
    assert (stats.unnamed_batches, stats.uncommitted_chunks) == (2, 0)
    # Only the objects commits name were copied: a's batch 1 and b's backup never were.
    cache = tmp_path / "prepared" / "campaign"
    copied = sorted(p.relative_to(cache).as_posix() for p in cache.rglob("completions_*"))
    assert copied == ["batches/a/ra/completions_000000.jsonl",
                      "batches/a/ra/completions_000002.jsonl",
                      "batches/b/rb/completions_000000.jsonl",
                      "batches/b/rb/completions_000001.jsonl"]
    assert source.copied == 4 and "4 batch objects its commits name, 4 copied now" in source.what

    # The reader of a plain run, over every batch, takes what no commit names: the scenario
    # has teeth.
    everything = tmp_path / "all"
    for key in s3ops.keys(client, store.bucket, f"{c.prefix}batches/"):
        dest = everything / key[len(c.prefix):]
        dest.parent.mkdir(parents=True, exist_ok=True)
        client.download_file(store.bucket, key, str(dest))
    plain = {ln.index: (ln.content or "").split()[0] for _, ln in
             current_lines(sorted(everything.rglob("completions_*")), ReadStats())}
    assert {"zombie", "backup"} & set(plain.values())


def test_an_unfinished_retry_leaves_the_first_lines_in_place(store: S3Server,
                                                             tmp_path: Path) -> None:
    c = build(store, retry_committed=False)
    source = open_source(c.url, tmp_path / "prepared", client=store.client())
    got, stats, order = read(source)
    assert sorted(order) == list(range(LINES))
    assert got == {i: "a0" for i in range(10)} | {i: "b0" for i in range(10, 30)}
    assert (stats.lines, stats.superseded, stats.left_out, stats.bad) == (35, 0, 5, 0)
    assert (stats.unnamed_batches, stats.uncommitted_chunks) == (3, 1)


def test_the_cache_is_reused_and_a_batch_that_is_not_its_commits_is_refused(
        store: S3Server, tmp_path: Path) -> None:
    c = build(store)
    client = store.client()
    out = tmp_path / "prepared"
    first = open_source(c.url, out, client=client)
    assert isinstance(first, CampaignSource) and first.copied == 4
    again = open_source(c.url, out, client=client)
    assert isinstance(again, CampaignSource) and again.copied == 0, "size and ETag unchanged"
    assert read(again)[0] == committed_answers()

    # b's batch 0 rewritten after its commit, same size, other bytes.
    key = c.key("b", 0)
    good = store.client().get_object(Bucket=store.bucket, Key=key)["Body"].read()
    bad = good.replace(b'"b0 12 ', b'"zz 12 ')
    assert bad != good and len(bad) == len(good)
    c.put(key, bad)
    for cache in (out, tmp_path / "fresh"):
        with pytest.raises(SourceError) as err:
            open_source(c.url, cache, client=client)
        msg = str(err.value)
        assert f"s3://{store.bucket}/{key}: {len(bad)} bytes, sha256 " \
               f"{hashlib.sha256(bad).hexdigest()}" in msg
        assert "commits/gen-0000/0000001 (node b) names it with" in msg
        assert hashlib.sha256(good).hexdigest() in msg and "none of it is read" in msg
    cached = out / "campaign" / key[len(c.prefix):]
    assert cached.read_bytes() == good, "the refused bytes replaced nothing"
    assert not (tmp_path / "fresh" / "campaign" / key[len(c.prefix):]).exists()
    # A changed size is refused before anything is copied.
    c.put(key, good + b"\n")
    with pytest.raises(SourceError, match=re.escape(f"{key}: {len(good) + 1} bytes; ")):
        open_source(c.url, out, client=client)


def pull(c: Campaign, folder: Path) -> Path:
    """A pulled copy of the campaign's prefix, as `aws s3 sync` makes it."""
    client = c.s3.client()
    for key in s3ops.keys(client, c.s3.bucket, c.prefix):
        dest = folder / key[len(c.prefix):]
        dest.parent.mkdir(parents=True, exist_ok=True)
        client.download_file(c.s3.bucket, key, str(dest))
    return folder


def test_a_pulled_copy_of_a_campaign_reads_through_its_commits(store: S3Server,
                                                               tmp_path: Path) -> None:
    folder = pull(build(store), tmp_path / "pulled")
    source = open_source(str(folder), tmp_path / "prepared")
    assert isinstance(source, CampaignSource)
    got, stats, order = read(source)
    assert sorted(order) == list(range(LINES)) and got == committed_answers()
    assert (stats.lines, stats.superseded, stats.left_out, stats.unnamed_batches) == \
        (39, 3, 6, 2)
    assert not (tmp_path / "prepared").exists(), "a local copy is read where it is"

    # Part of its batches alone would bring a zombie's lines: refused, naming the campaign.
    said = re.escape(f'read the campaign itself, data = "{folder}"')
    for part in ("batches", "batches/a", "batches/a/ra"):
        with pytest.raises(SourceError, match=said):
            open_source(str(folder / part), tmp_path / "prepared")

    local = folder / "batches" / "a" / "ra" / "completions_000002.jsonl"
    local.write_bytes(local.read_bytes().replace(b'"a1 03 ', b'"zz 03 '))
    with pytest.raises(SourceError, match=re.escape(str(local)) + r": .* bytes, sha256 .*; "
                                          r"commits/gen-0001/0000000 \(node a\) names it"):
        list(open_source(str(folder), tmp_path / "prepared").lines(ReadStats()))


def test_a_plain_prefix_reads_as_before(store: S3Server, tmp_path: Path) -> None:
    client = store.client()
    prefix = f"plain/{uuid.uuid4().hex[:8]}"
    lines = [line(i, "p") for i in range(12)] + [line(4, "retry", attempt=2)]
    client.put_object(Bucket=store.bucket, Key=f"{prefix}/completions_000000.jsonl",
                      Body=body(lines[:7]))
    client.put_object(Bucket=store.bucket, Key=f"{prefix}/completions_000001.jsonl",
                      Body=body(lines[7:]))
    source = open_source(f"s3://{store.bucket}/{prefix}", tmp_path / "prepared", client=client)
    assert isinstance(source, BatchFolder) and len(source.files) == 2
    got, stats, order = read(source)
    assert sorted(order) == list(range(12))
    assert got == {i: "p" for i in range(12)} | {4: "retry"}, "the highest attempt wins"
    assert (stats.lines, stats.superseded, stats.left_out, stats.unnamed_batches) == \
        (13, 1, 0, 0)
    assert sorted(p.name for p in (tmp_path / "prepared" / "source").iterdir()) == [
        ".etags.json", "completions_000000.jsonl", "completions_000001.jsonl"]
    # A node's batches under a campaign prefix are not a plain run's.
    c = build(store)
    with pytest.raises(SourceError, match=re.escape(f'data = "{c.url}", through its commits')):
        open_source(f"{c.url}batches/a/ra", tmp_path / "other", client=client)


def test_prepare_reports_what_was_left_out(store: S3Server, tmp_path: Path, random_world: World,
                                           capsys: pytest.CaptureFixture[str],
                                           caplog: pytest.LogCaptureFixture,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    c = build(store)
    spec = write_spec(tmp_path / "run.toml", c.url, random_world.target, tmp_path / "run")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", store.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", store.secret_key)
    with caplog.at_level("INFO", logger="fleetdeck.train.prepare"):
        r = cli(capsys, "prepare", str(spec), "--endpoint-url", store.endpoint_url)
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert (rep["lines"], rep["completions"], rep["superseded"], rep["bad_lines"]) == \
        (39, 30, 3, 0)
    assert (rep["left_out"], rep["unnamed_batches"], rep["uncommitted_chunks"]) == (6, 2, 0)
    assert rep["truncated"] == 0, "the retried answers replaced the cut ones"
    assert "6 lines from uncommitted work left out; 2 batch objects no commit names not " \
           "read" in caplog.text


def test_a_campaign_nodes_run_dir_is_refused(tmp_path: Path) -> None:
    """A node's own batches hold the lines of chunks it lost too."""
    run = tmp_path / "run"
    (run / "queue").mkdir(parents=True)
    (run / "completions").mkdir()
    (run / "completions" / "completions_000000.jsonl").write_bytes(body([line(0, "a0")]))
    assert isinstance(open_source(str(run / "completions"), tmp_path / "p"), BatchFolder)
    (run / "queue" / "member.json").write_text('{"run_id": "r"}')
    for data in (run, run / "completions"):
        with pytest.raises(SourceError, match=r"the batches of a campaign node .* read the "
                                              r"campaign through its commits"):
            open_source(str(data), tmp_path / "p")
