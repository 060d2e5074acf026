"""A full disk (ENOSPC) or a file grown past its limit (EFBIG) in the middle of a group write:
the group is cut back to the last durable offset before anything else happens, a batch never
closes with a line that .done_indices lacks, and a resume after space is freed ends with
`verify` green. Injected at fault points (after k bytes of a group), and on a real tmpfs."""

from __future__ import annotations

import errno
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from agents.artifacts.verify import verify_run
from agents.engine.store import BatchStore
from agents.rundir.crashpoint import arm_fault, disarm_fault
from tests.engine.runs import read_run, start_engine, write_prompts, write_spec
from tests.engine.smallfs import grow, small_tmpfs


def _line(i: int, attempt: int = 1) -> tuple[int, int, bytes]:
    return i, attempt, (json.dumps({"index": i, "attempt": attempt, "content": "x" * 40}) +
                        "\n").encode()


LINE = len(_line(0)[2])


@pytest.fixture(autouse=True)
def _no_fault_left() -> Iterator[None]:
    yield
    disarm_fault()


def _lines_of(path: Path) -> list[tuple[int, int]]:
    """(index, attempt) of every line; a torn or unreadable line fails the test."""
    data = path.read_bytes()
    assert not data or data.endswith(b"\n"), f"{path.name} ends with a torn line"
    out = []
    for raw in data.splitlines():
        obj = json.loads(raw)
        out.append((obj["index"], obj["attempt"]))
    return out


def _recorded(folder: Path) -> list[tuple[int, int]]:
    data = (folder / ".done_indices").read_bytes()
    assert not data or data.endswith(b"\n"), ".done_indices ends with a torn record"
    out = []
    for raw in data.splitlines():
        parts = raw.split()
        out.append((int(parts[0]), int(parts[1]) if len(parts) > 1 else 1))
    return out


@pytest.mark.parametrize("err", [errno.ENOSPC, errno.EFBIG], ids=["ENOSPC", "EFBIG"])
@pytest.mark.parametrize("point,after", [
    ("write_group", 0), ("write_group", LINE // 2), ("write_group", LINE + 7),
    ("write_group", 2 * LINE), ("record", 0), ("record", 3),
], ids=["group-0", "group-half-line", "group-line-and-a-bit", "group-two-lines", "record-0",
        "record-3"])
def test_a_failed_group_is_cut_back_and_the_batch_closes_clean(
        tmp_path: Path, point: str, after: int, err: int) -> None:
    store = BatchStore(tmp_path, batch_size=10, total=100)
    store.recover()
    store.write_group([_line(i) for i in range(4)])
    comp = tmp_path / "completions"
    partial = comp / "completions_000000.jsonl.partial"
    size_before = partial.stat().st_size
    done_before = (comp / ".done_indices").stat().st_size

    arm_fault(point, 1, after, err)
    with pytest.raises(OSError) as failed:
        store.write_group([_line(i) for i in range(4, 8)])
    assert failed.value.errno == err
    disarm_fault()
    # Cut back before the error went on: the files are as they were before the group.
    assert partial.stat().st_size == size_before
    assert (comp / ".done_indices").stat().st_size == done_before
    assert [i for i in range(10) if i in store.done] == [0, 1, 2, 3]

    closed = store.close_open_batch()
    store.close()
    assert closed is not None and closed.lines == 4
    assert _lines_of(closed.path) == _recorded(comp) == [(i, 1) for i in range(4)]

    # A resume writes the failed group's lines once.
    again = BatchStore(tmp_path, batch_size=10, total=100)
    rec = again.recover()
    assert rec.torn_bytes_cut == 0 and rec.recorded_after_crash == 0
    again.write_group([_line(i) for i in range(4, 8)])
    last = again.close_open_batch()
    again.close()
    assert last is not None and _lines_of(last.path) == [(i, 1) for i in range(4, 8)]
    assert _recorded(comp) == [(i, 1) for i in range(8)]


def test_a_failure_in_the_second_batch_of_a_group_keeps_the_first(tmp_path: Path) -> None:
    """A group that fills a batch and spills into the next: the full batch closes committed,
    only the spilled piece is cut back."""
    store = BatchStore(tmp_path, batch_size=4, total=100)
    store.recover()
    store.write_group([_line(i) for i in range(2)])
    arm_fault("write_group", 2, LINE + 3, errno.ENOSPC)
    with pytest.raises(OSError):
        store.write_group([_line(i) for i in range(2, 8)])
    disarm_fault()
    comp = tmp_path / "completions"
    assert [c.path.name for c in store.closed_in_failed_group] == ["completions_000000.jsonl"]
    assert _lines_of(comp / "completions_000000.jsonl") == [(i, 1) for i in range(4)]
    assert (comp / "completions_000001.jsonl.partial").read_bytes() == b""
    assert store.close_open_batch() is None  # an empty open batch is dropped, not closed
    store.close()
    assert _recorded(comp) == [(i, 1) for i in range(4)]


@pytest.mark.parametrize("err,after", [("ENOSPC", 700), ("EFBIG", 1500)])
def test_engine_stops_on_a_torn_group_write_and_resume_verifies_green(
        tmp_path: Path, sims, err: str, after: int) -> None:
    sim = sims()
    prompts = tmp_path / "prompts.jsonl"
    write_prompts(prompts, 300, bad_every=97)
    spec = write_spec(tmp_path / "run.toml", prompts, [sim.url], batch_size=30)
    full = start_engine(spec, env={"FLEETDECK_FAIL_AT": "write_group:4",
                                   "FLEETDECK_FAIL_BYTES": str(after),
                                   "FLEETDECK_FAIL_ERRNO": err})
    assert full.wait(300) == 1, full.stderr()
    run_dir = tmp_path / "run"
    progress = json.loads((run_dir / "progress.json").read_text())
    assert progress["status"] == "failed" and "resume" in progress["message"]
    before = read_run(run_dir)  # strict: every line recorded, none twice, nothing torn
    assert 0 < len(before.current) < 300
    assert "Traceback" not in full.stderr()
    resumed = start_engine(spec)
    assert resumed.wait(300) == 0, resumed.stderr()
    st = read_run(run_dir)
    assert st.todo == set() and len(st.current) + len(st.failed) == 300
    report = verify_run(run_dir)
    assert report.ok, report.problems


def test_a_real_full_tmpfs_then_space_freed_ends_with_verify_green(tmp_path: Path,
                                                                    sims) -> None:
    sim = sims()
    prompts = tmp_path / "prompts.jsonl"
    write_prompts(prompts, 400)
    run_dir = tmp_path / "run"  # the run directory is the small filesystem
    with small_tmpfs(run_dir, "96k"):
        spec = write_spec(tmp_path / "run.toml", prompts, [sim.url], batch_size=40)
        full = start_engine(spec)
        assert full.wait(300) == 1, full.stderr()
        st = read_run(run_dir)  # strict: the full disk tore nothing
        assert len(st.current) < 400
        log = full.stderr()
        assert "No space left on device" in log and "Traceback" not in log, log
        progress = json.loads((run_dir / "progress.json").read_text())
        assert progress["status"] in ("failed", "running"), progress

        grow(run_dir, "16m")
        resumed = start_engine(spec)
        assert resumed.wait(300) == 0, resumed.stderr()
        st = read_run(run_dir)
        assert st.todo == set() and len(st.current) == 400 and st.lines == 400
        report = verify_run(run_dir)
        assert report.ok, report.problems
        progress = json.loads((run_dir / "progress.json").read_text())
        assert progress["status"] == "done" and progress["completed"] == 400


def test_atomic_write_on_a_full_disk_leaves_no_temp_file(tmp_path: Path) -> None:
    """A failed atomic write keeps the old file and frees what its temp file took: else each
    heartbeat on a full disk would leave one more `.progress.json.PID.tmp` behind."""
    from agents.rundir.atomic import atomic_write

    folder = tmp_path / "small"
    with small_tmpfs(folder, "64k"):
        target = folder / "progress.json"
        atomic_write(target, b"old")
        with pytest.raises(OSError) as err:
            atomic_write(target, b"x" * (256 << 10))
        assert err.value.errno == errno.ENOSPC
        assert target.read_bytes() == b"old"
        assert sorted(p.name for p in folder.iterdir()) == ["progress.json"]
