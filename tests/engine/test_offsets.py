"""The prompts file's offset index: what it reads is exactly what `stream()` yields, on every
awkward file (a BOM, no final newline, empty and over-long lines, CRLF); a resume seeks past
its done lines; and an index that does not match its file (edited in the run dir, left by
another prompts file of the same size) is caught on the first line read and built again,
with every line still the right prompt."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from agents.engine.doneset import DoneSet
from agents.engine.offsets import FILE, OffsetIndex, StaleOffsets
from agents.engine.prompts import BOM, TooLong, stream
from tests.engine.runs import read_run, start_engine, wait_progress, write_prompts, write_spec

MAX = 64


def _line(i: int, size: int = 20) -> bytes:
    return json.dumps({"messages": [{"role": "user", "content": f"p{i} " + "x" * size}]}).encode()


FILES = {
    "plain": b"".join(_line(i) + b"\n" for i in range(5)),
    "bom": BOM + b"".join(_line(i) + b"\n" for i in range(5)),
    "no final newline": b"\n".join(_line(i) for i in range(5)),
    "empty and blank lines": _line(0) + b"\n\n   \n" + _line(3) + b"\n\n",
    "long in the middle": _line(0) + b"\n" + _line(1, 200) + b"\n" + _line(2) + b"\n",
    "long at the end, no newline": _line(0) + b"\n" + _line(1, 200),
    "long first after a bom": BOM + _line(0, 200) + b"\n" + _line(1) + b"\n",
    "crlf": b"".join(_line(i) + b"\r\n" for i in range(4)),
    "one line": _line(0),
    "one newline more than max": b"y" * MAX + b"\n" + b"z" * (MAX + 1) + b"\n",
}


def _same(a: list[tuple[int, bytes | TooLong]], b: list[tuple[int, bytes | TooLong]]) -> None:
    assert [i for i, _ in a] == [i for i, _ in b]
    for (i, x), (_, y) in zip(a, b, strict=True):
        if isinstance(x, TooLong) or isinstance(y, TooLong):
            assert isinstance(x, TooLong) and isinstance(y, TooLong), i
            assert x.limit == y.limit
        else:
            assert x == y, i


@pytest.mark.parametrize("name", sorted(FILES))
def test_the_index_reads_what_stream_yields(tmp_path: Path, name: str) -> None:
    path = tmp_path / "p.jsonl"
    path.write_bytes(FILES[name])
    index = OffsetIndex.build(path)
    every = list(stream(path, lambda i: True, max_bytes=MAX))
    assert index.lines == len(every)
    _same(list(index.read(path, range(index.lines), MAX)), every)
    odd = list(stream(path, lambda i: i % 2 == 1, max_bytes=MAX))
    _same(list(index.read(path, range(1, index.lines, 2), MAX)), odd)


def test_the_done_sets_missing_indices_skip_runs_of_done() -> None:
    rng = random.Random(3)
    done = DoneSet(1000)
    for i in rng.sample(range(1000), 700):
        done.add(i)
    for i in range(200, 600):
        done.add(i)
    want = [i for i in range(1000) if i not in done]
    assert list(done.missing()) == want
    assert list(done.missing(333)) == [i for i in want if i >= 333]
    full = DoneSet(13)
    for i in range(13):
        full.add(i)
    assert list(full.missing()) == [] and list(DoneSet(13).missing(5)) == list(range(5, 13))


def test_an_index_that_does_not_match_its_file_is_caught_on_the_first_line_read(
        tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_bytes(FILES["plain"])
    good = OffsetIndex.build(path)
    size = len(FILES["plain"])
    saved = tmp_path / FILE
    OffsetIndex.load_or_build(path, saved, good.lines, size)
    # The same count and end, one start moved two bytes: load_or_build cannot tell...
    shifted = list(good.offsets)
    shifted[2] += 2
    bad = OffsetIndex.load_or_build(path, saved, good.lines, size)
    bad.offsets[2] = shifted[2]
    for indices in ([2], [1], [0, 1, 2]):
        with pytest.raises(StaleOffsets, match=f"{FILE} does not match"):
            list(bad.read(path, indices, MAX))
    # ... rebuild=True makes it from the file again.
    again = OffsetIndex.load_or_build(path, saved, good.lines, size, rebuild=True)
    assert list(again.offsets) == list(good.offsets)


def test_a_resume_seeks_past_done_lines_and_a_tampered_index_is_built_again(
        tmp_path: Path, sims) -> None:
    sim = sims("--time-scale", "0.2")
    prompts = tmp_path / "prompts.jsonl"
    write_prompts(prompts, 300)
    spec = write_spec(tmp_path / "run.toml", prompts, [sim.url], batch_size=30)
    engine = start_engine(spec)
    wait_progress(engine, lambda p: p["completed"] >= 60, 120, "first completions")
    engine.proc.terminate()
    assert engine.wait(300) == 0, engine.stderr()
    saved = engine.run_dir / FILE
    good = saved.read_bytes()
    assert len(good) == 8 * 301
    # Every line start moved by one byte, the end kept: the same size, the wrong lines.
    raw = bytearray(good)
    offsets = [int.from_bytes(raw[k:k + 8], "little") for k in range(0, len(raw), 8)]
    moved = [o + 1 if 0 < n < 300 else o for n, o in enumerate(offsets)]
    saved.write_bytes(b"".join(o.to_bytes(8, "little") for o in moved))
    again = start_engine(write_spec(tmp_path / "run.toml", prompts, [sims().url],
                                    batch_size=30))
    assert again.wait(300) == 0, again.stderr()
    log = (again.run_dir / "logs" / "generate.log").read_text()
    assert "building the offset index again" in log, log[-2000:]
    assert saved.read_bytes() == good
    st = read_run(again.run_dir)
    assert st.todo == set() and len(st.current) == 300
    for index, line in st.current.items():  # each line answers its own prompt
        asked = " ".join(str(m.get("content", "")) for m in line["messages"])
        assert f"{index}:" in asked or f"Task {index}:" in asked, (index, asked)
    assert not (again.run_dir / "failures.jsonl").exists() or \
        "bad_input" not in (again.run_dir / "failures.jsonl").read_text()
