"""One prompt line never kills the run: whatever is wrong with it (nested too deeply, over
`[generate] max_prompt_bytes`, not JSON), that index is `bad_input` with the reason and the
rest is generated; a huge line is never loaded whole; a UTF-8 BOM is accepted; an empty
prompts file is refused at start."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from agents.engine.prompts import MAX_NESTING, BadPrompt, TooLong, nesting, parse_prompt, stream
from tests.engine.runs import read_run, start_engine, write_spec

USER = {"role": "user", "content": "hello"}


def _ok(i: int) -> bytes:
    return json.dumps({"messages": [{"role": "user", "content": f"question {i}"}]}).encode()


def _deep(depth: int) -> bytes:
    return b'{"messages":[{"role":"user","content":' + b"[" * depth + b"]" * depth + b"}]}"


def _failures(run_dir: Path) -> dict[int, dict]:
    out = {}
    for raw in (run_dir / "failures.jsonl").read_text().splitlines():
        ev = json.loads(raw)
        if ev.get("index") is not None:
            out[ev["index"]] = ev
    return out


def test_parse_prompt_turns_every_failure_into_a_reason() -> None:
    # Very deep lines are refused by msgspec's own recursion guard or by our walk, depending
    # on the interpreter's stack (a pytest-xdist worker's differs): both say "nested".
    for depth, why in ((3_000, "nested"), (100_000, "nested"),
                       (MAX_NESTING + 5, f"nested {MAX_NESTING + 8} levels deep")):
        try:
            parse_prompt(0, _deep(depth))
        except BadPrompt as exc:
            assert why in str(exc)
        else:
            raise AssertionError(f"depth {depth} accepted")
    for depth in (5000, MAX_NESTING + 1):
        tools = json.dumps({"messages": [USER], "tools": "[" * depth + "]" * depth}).encode()
        try:
            parse_prompt(0, tools)
        except BadPrompt as exc:
            assert "tools is a string of JSON nested" in str(exc)
        else:
            raise AssertionError(f"a tools string {depth} deep accepted")
    try:
        parse_prompt(3, TooLong(150_000_000, 16 << 20))
    except BadPrompt as exc:
        assert "150,000,000 bytes, over [generate] max_prompt_bytes (16,777,216)" in str(exc)
    else:
        raise AssertionError("a too-long line accepted")
    assert nesting({"a": [[{"b": 1}]]}) == 4 and nesting(5) == 0


def test_stream_passes_a_bom_and_never_holds_a_long_line(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    long_line = b'{"messages": [{"role": "user", "content": "' + b"x" * 5000 + b'"}]}'
    path.write_bytes(b"\xef\xbb\xbf" + _ok(0) + b"\n" + long_line + b"\n" + _ok(2))
    got = list(stream(path, lambda i: True, max_bytes=4096))
    assert got[0] == (0, _ok(0) + b"\n")
    assert got[1] == (1, TooLong(len(long_line), 4096))
    assert got[2] == (2, _ok(2))
    assert parse_prompt(0, got[0][1]).messages[0]["content"] == "question 0"  # type: ignore[arg-type]
    # Exactly at the limit is read; one byte over is not.
    path.write_bytes(b"a" * 4096 + b"\n" + b"b" * 4097 + b"\n")
    assert [type(r).__name__ for _, r in stream(path, lambda i: True, max_bytes=4096)] == \
        ["bytes", "TooLong"]


def test_one_bad_line_of_each_kind_is_bad_input_and_the_run_goes_on(tmp_path: Path,
                                                                     sims) -> None:
    sim = sims()
    prompts = tmp_path / "prompts.jsonl"
    bad = {
        1: (_deep(3_000), "nested too deeply"),
        3: (_deep(100_000), "nested too deeply"),
        4: (b'{"messages": [{"role": "user", "content": "' + b"y" * 400_000 + b'"}]}',
            "over [generate] max_prompt_bytes (300,000)"),
        5: (json.dumps({"messages": [USER], "tools": "[" * 3000 + "]" * 3000}).encode(),
            "tools is a string of JSON nested too deeply"),
        6: (_deep(MAX_NESTING + 50), "levels deep"),
        7: (b"\xff\xfe not utf-8", "not valid JSON"),
    }
    lines = [bad[i][0] if i in bad else _ok(i) for i in range(40)]
    prompts.write_bytes(b"\xef\xbb\xbf" + b"\n".join(lines) + b"\n")
    spec = write_spec(tmp_path / "run.toml", prompts, [sim.url], batch_size=10,
                      max_prompt_bytes=300_000)
    engine = start_engine(spec)
    assert engine.wait(300) == 0, engine.stderr()
    assert "Traceback" not in engine.stderr()
    run_dir = tmp_path / "run"
    st = read_run(run_dir)
    assert set(st.current) == set(range(40)) - set(bad)  # the BOM line (index 0) is done
    failures = _failures(run_dir)
    assert set(failures) == set(bad)
    for i, (_, why) in bad.items():
        ev = failures[i]
        assert ev["error"] == "bad_input" and why in ev["message"], ev
        assert ev["message"].startswith(f"line {i + 1}:")
    progress = json.loads((run_dir / "progress.json").read_text())
    assert progress["status"] == "done" and progress["bad_input"] == len(bad)
    # Every resume used to die on the same line; now it has nothing left to do.
    again = start_engine(spec)
    assert again.wait(300) == 0, again.stderr()
    assert read_run(run_dir).lines == st.lines


def _peak_rss_kib(spec: Path) -> tuple[int, int, str]:
    """Run the engine to its end; (exit code, peak RSS in KiB, output)."""
    log = spec.parent / f"rss-{time.monotonic_ns()}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "agents.cli", "generate", str(spec)],
                                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, usage.ru_maxrss, log.read_text(errors="replace")


def test_a_150_mb_line_is_bad_input_without_being_loaded(tmp_path: Path, sims) -> None:
    sim = sims()
    small = tmp_path / "small"
    small.mkdir()
    (small / "prompts.jsonl").write_bytes(b"\n".join(_ok(i) for i in range(20)) + b"\n")
    code, base_kib, out = _peak_rss_kib(write_spec(small / "run.toml", small / "prompts.jsonl",
                                                   [sim.url]))
    assert code == 0, out
    big = tmp_path / "big"
    big.mkdir()
    with open(big / "prompts.jsonl", "wb") as f:
        for i in range(10):
            f.write(_ok(i) + b"\n")
        f.write(b'{"messages": [{"role": "user", "content": "')
        chunk = b"z" * (1 << 20)
        for _ in range(150):
            f.write(chunk)
        f.write(b'"}]}\n')
        for i in range(11, 20):
            f.write(_ok(i) + b"\n")
    code, big_kib, out = _peak_rss_kib(write_spec(big / "run.toml", big / "prompts.jsonl",
                                                  [sim.url]))
    assert code == 0, out
    failures = _failures(big / "run")
    assert list(failures) == [10] and "over [generate] max_prompt_bytes" in \
        failures[10]["message"]
    assert len(read_run(big / "run").current) == 19
    grown_mib = (big_kib - base_kib) / 1024
    print(f"peak RSS: {base_kib / 1024:.0f} MiB on 20 small lines, {big_kib / 1024:.0f} MiB "
          f"with a 150 MiB line (+{grown_mib:.0f} MiB)")
    # The 16 MiB read buffer and its copy at most: not the 150 MiB line (678 MB before).
    assert grown_mib < 48, f"peak RSS grew by {grown_mib:.0f} MiB on one 150 MiB line"


def test_an_empty_prompts_file_is_refused_at_start(tmp_path: Path, sims) -> None:
    sim = sims()
    for name, content in (("empty.jsonl", b""), ("blank.jsonl", b"\n  \n\t\n"),
                          ("bom.jsonl", b"\xef\xbb\xbf\n")):
        prompts = tmp_path / name
        prompts.write_bytes(content)
        spec = write_spec(tmp_path / "run.toml", prompts, [sim.url])
        engine = start_engine(spec)
        assert engine.wait(300) == 2, engine.stderr()
        err = engine.stderr()
        assert "prompts file is empty" in err and str(prompts) in err and "Traceback" not in err
        assert not (tmp_path / "run" / "run.pin.json").exists(), "an empty run was pinned"
        progress = tmp_path / "run" / "progress.json"
        assert not progress.exists() or json.loads(progress.read_text())["status"] != "done"
