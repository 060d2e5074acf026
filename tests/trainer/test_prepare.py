"""`fleetdeck-train prepare`: batches in, shards and a report out, and the quality gate."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import msgspec
import pytest

from agents.rundir.schema import BatchLine
from tests.servers.s3 import S3Server
from tests.trainer.conftest import cli
from tests.trainer.tinyworld import TOOLS, WORDS, World, batch_line, write_batches, write_spec
from trainer.prepare import PrepareSettings, prepare
from trainer.render import render, tokenize
from trainer.report import REPORT_NAME
from trainer.shards import ShardSet


def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def empty_shaped(n: int = 100, empty_share: float = 0.87, seed: int = 0) -> list[dict[str, Any]]:
    """The reference project's data set: 87% of answers empty, in thinking mode."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        msgs = [{"role": "user", "content": "repeat " + words(rng, 4)}]
        empty = i < round(n * empty_share)
        out.append(batch_line(i, msgs, "" if empty else words(rng, 60),
                              reasoning="" if empty else None, kwargs={}))
    rng.shuffle(out)
    return out


def healthy(n: int = 120, seed: int = 1) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        msgs = [{"role": "user", "content": "repeat " + words(rng, 4)}]
        if i % 10 == 0:  # a few short answers: under the minimum, but under 20%
            out.append(batch_line(i, msgs, words(rng, 3)))
        elif i % 10 == 1:  # a tool call
            call = {"id": f"c{i}", "type": "function",
                    "function": {"name": "lookup", "arguments": json.dumps({"word": "ban"})}}
            out.append(batch_line(i, msgs, words(rng, 40), tool_calls=[call], tools=TOOLS,
                                  finish="tool_calls"))
        elif i % 10 == 2:  # cut by max_tokens
            out.append(batch_line(i, msgs, words(rng, 80), finish="length"))
        else:
            out.append(batch_line(i, msgs, words(rng, rng.randint(35, 120))))
    return out


def spec_for(tmp_path: Path, world: World, data: str, **train: Any) -> Path:
    return write_spec(tmp_path / "run.toml", data, world.target, tmp_path / "run", **train)


def test_empty_answers_carry_six_tokens_of_template_scaffolding(tok: Any) -> None:
    ln = msgspec.convert(empty_shaped(1, 1.0)[0], BatchLine)
    sample = tokenize(tok, render(tok, ln), 4096)
    # <think> \n\n </think> \n\n <|im_end|> \n: not empty, and far under 2 x 16.
    assert sample.supervised == 6
    assert [tok.decode([t]) for t, m in zip(sample.input_ids, sample.loss_mask, strict=True)
            if m] == ["<think>", "\n\n", "</think>", "\n\n", "<|im_end|>", "\n"]


def test_gate_refuses_the_87_percent_empty_data_set(tmp_path: Path, random_world: World,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    write_batches(tmp_path / "data", empty_shaped())
    spec = spec_for(tmp_path, random_world, str(tmp_path / "data"))
    r = cli(capsys, "prepare", str(spec))
    assert r.returncode == 1, r.stderr
    assert "87 of 100 samples (87.0%) have fewer than 32 supervised tokens" in r.stderr
    report = json.loads(r.stdout)
    assert report["gate"]["passed"] is False
    assert report["under_min"] == 87 and report["under_min_share"] == pytest.approx(0.87)
    assert {"lo": 4, "hi": 8, "samples": 87} in report["histogram"]
    prepared = tmp_path / "run" / "prepared"
    assert json.loads((prepared / REPORT_NAME).read_text())["gate"]["passed"] is False
    assert not list(prepared.glob("*.arrow")), "no shards from a refused data set"
    # Training on it is refused too.
    r = cli(capsys, "train", str(spec))
    assert r.returncode == 1 and "quality gate" in r.stderr
    progress = json.loads((tmp_path / "run" / "progress.json").read_text())
    assert progress["status"] == "failed" and "quality gate" in progress["message"]


def test_gate_judges_tokens_not_strings(tmp_path: Path, random_world: World) -> None:
    """Answers that are not empty strings but are a word long are just as useless."""
    lines = empty_shaped()
    for ln in lines:
        if ln["content"] == "":
            ln["content"] = "ok"
    write_batches(tmp_path / "data", lines)
    report = prepare(PrepareSettings(str(tmp_path / "data"), str(random_world.target),
                                     tmp_path / "out"))
    assert not report.gate.passed and report.under_min == 87


def test_healthy_data_set_passes_with_a_full_report(tmp_path: Path, random_world: World,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    lines = healthy()
    # A retried index: attempt 2 supersedes attempt 1, whichever file holds it.
    retry = dict(lines[5], content="ban " * 50, attempt=2)
    lines.append(retry)
    paths = write_batches(tmp_path / "data", lines, per_file=40)
    with open(paths[1], "ab") as f:
        f.write(b'{"index": 999, "messages": [\n')  # torn JSON
        f.write(b'{"index": 998}\n')  # missing fields
        f.write(b"\xff\xfe not utf-8\n")
    spec = spec_for(tmp_path, random_world, str(tmp_path / "data"), heldout_share=0.2)
    r = cli(capsys, "prepare", str(spec))
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["gate"] == {"passed": True, "reason": None, "min_supervised": 32,
                           "max_under_min_share": 0.2}
    assert rep["lines"] == 124 and rep["bad_lines"] == 3 and rep["superseded"] == 1
    wheres = [p["where"] for p in rep["problems"]]
    assert sorted(wheres) == [f"{paths[1]}:{n}" for n in (41, 42, 43)]
    assert rep["completions"] == 120 and rep["truncated"] == 12
    assert rep["truncated_share"] == pytest.approx(0.1)
    assert rep["samples"] == 108, "truncated answers are left out by default"
    assert rep["under_min"] == 12 and rep["tool_call"] == 12
    assert rep["tool_call_share"] == pytest.approx(12 / 108)
    assert rep["train_samples"] + rep["heldout_samples"] == 96
    assert rep["heldout_samples"] > 0
    assert sum(b["samples"] for b in rep["histogram"]) == 108
    assert rep["supervised_tokens"] < rep["tokens"]
    prepared = tmp_path / "run" / "prepared"
    train = ShardSet(prepared, "train")
    held = ShardSet(prepared, "heldout")
    assert len(train) + len(held) == 96
    rows = {train.row(i).index: train.row(i) for i in range(len(train))}
    rows.update({held.row(i).index: held.row(i) for i in range(len(held))})
    tok = random_world.tokenizer
    text = tok.decode(rows[5].input_ids[rows[5].loss_mask].tolist())
    assert text == "ban " * 50 + "<|im_end|>\n", "the highest attempt is the one kept"
    for row in rows.values():
        assert row.loss_mask.sum() >= 32 and not row.loss_mask[: row.prompt_len].any()
    # Truncated answers on request.
    r = cli(capsys, "prepare", str(spec), "--keep-truncated")
    assert r.returncode == 0 and json.loads(r.stdout)["samples"] == 120


def test_bad_input_is_a_usage_error_naming_the_file(tmp_path: Path, random_world: World,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    spec = spec_for(tmp_path, random_world, str(tmp_path / "nowhere"))
    r = cli(capsys, "prepare", str(spec))
    assert r.returncode == 2 and f"{tmp_path / 'nowhere'}: no such folder" in r.stderr
    spec.write_text(spec.read_text().replace("block_size = 16", "block_sise = 16"))
    r = cli(capsys, "prepare", str(spec))
    assert r.returncode == 2 and "unknown field `block_sise`" in r.stderr
    assert str(spec) in r.stderr


def test_reads_batches_from_s3(tmp_path: Path, random_world: World, s3: S3Server,
                               capsys: pytest.CaptureFixture[str],
                               monkeypatch: pytest.MonkeyPatch) -> None:
    paths = write_batches(tmp_path / "data", healthy(60), per_file=25)
    client = s3.client()
    for p in paths:
        client.upload_file(str(p), s3.bucket, f"runs/gen1/{p.name}")
    client.put_object(Bucket=s3.bucket, Key="runs/gen1/uploads.jsonl", Body=b"x")
    client.put_object(Bucket=s3.bucket, Key="runs/gen10/completions_000000.jsonl", Body=b"x")
    spec = spec_for(tmp_path, random_world, f"s3://{s3.bucket}/runs/gen1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3.secret_key)
    r = cli(capsys, "prepare", str(spec), "--endpoint-url", s3.endpoint_url)
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["lines"] == 60 and rep["completions"] == 60 and rep["bad_lines"] == 0
    local = prepare(PrepareSettings(str(tmp_path / "data"), str(random_world.target),
                                    tmp_path / "local"))
    assert (rep["samples"], rep["tokens"]) == (local.samples, local.tokens)


def long_tailed(seed: int = 4) -> list[dict[str, Any]]:
    """40 answers, 10 longer than 3,072 tokens (the reference run had about a quarter): 5
    whose reasoning alone passes the cut (the answer is lost whole), 5 without reasoning
    (only the answer's end and <|im_end|> are lost)."""
    rng = random.Random(seed)
    out = []
    for i in range(40):
        msgs = [{"role": "user", "content": "repeat " + words(rng, 4)}]
        if i < 5:
            out.append(batch_line(i, msgs, words(rng, 50), reasoning=words(rng, 3200),
                                  kwargs={}))
        elif i < 10:
            out.append(batch_line(i, msgs, words(rng, 3200)))
        else:
            out.append(batch_line(i, msgs, words(rng, rng.randint(40, 200))))
    return out


def test_gate_refuses_a_set_whose_endings_the_default_max_length_cuts(
        tmp_path: Path, random_world: World, capsys: pytest.CaptureFixture[str]) -> None:
    write_batches(tmp_path / "data", long_tailed())
    spec = spec_for(tmp_path, random_world, str(tmp_path / "data"))
    r = cli(capsys, "prepare", str(spec))
    assert r.returncode == 1, r.stderr
    assert ("10 of 40 samples (25.0%) are longer than max_length 3072 tokens and would lose "
            "their ending") in r.stderr
    assert "5 the whole answer" in r.stderr and "[train] max_cut_share" in r.stderr
    rep = json.loads(r.stdout)
    lengths = rep["lengths"]
    assert lengths["cut"] == 10 and lengths["lost_answer"] == 5
    assert lengths["cut_share"] == pytest.approx(0.25) and lengths["explicit"] is False
    assert lengths["p50"] < 300 < 3072 < lengths["p90"] <= lengths["longest"]
    assert lengths["longest"] > 3200 and lengths["longest_kept"] == 3072
    assert not list((tmp_path / "run" / "prepared").glob("*.arrow"))
    # Set explicitly, the same cut is the user's choice: reported, not refused.
    r = cli(capsys, "prepare", str(spec), "--max-length", "3072")
    assert r.returncode == 0, r.stderr
    lengths = json.loads(r.stdout)["lengths"]
    assert lengths["explicit"] is True and lengths["cut"] == 10
    train = ShardSet(tmp_path / "run" / "prepared", "train")
    assert max(len(train.row(i).input_ids) for i in range(len(train))) == 3072


def test_a_cut_under_max_cut_share_passes_with_its_figures(tmp_path: Path,
                                                           random_world: World) -> None:
    lines = long_tailed()[8:]  # 2 of 32 cut: 6.25%, over 5%; 10% allowed here
    write_batches(tmp_path / "data", lines)
    report = prepare(PrepareSettings(str(tmp_path / "data"), str(random_world.target),
                                     tmp_path / "out", max_cut_share=0.1))
    assert report.gate.passed and report.lengths is not None
    assert report.lengths.cut == 2 and report.lengths.lost_answer == 0
    refused = prepare(PrepareSettings(str(tmp_path / "data"), str(random_world.target),
                                      tmp_path / "out2"))
    assert not refused.gate.passed and "2 of 32 samples (6.2%)" in (refused.gate.reason or "")
