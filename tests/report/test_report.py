"""`fleetdeck report`: a finished run's whole history as one page and seven PNGs, read from a
pulled copy here or live through the node's `history` RPC (a local node: the real agent's
`serve --stdio`, the bytes SSH would carry), for one node or a campaign; and what a run
directory cannot do to it (hostile names, unreadable lines, no history)."""

from __future__ import annotations

import html.parser
import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
from PIL import Image

from console.report.render import PLOTS

AGENT = str(Path(sys.executable).parent / "fleetdeck-agent")


def report(*args: str, fleet: Path | None = None) -> subprocess.CompletedProcess[str]:
    head = [sys.executable, "-m", "console.cli"] + (["--fleet", str(fleet)] if fleet else [])
    return subprocess.run([*head, "report", *args], capture_output=True, text=True,
                          timeout=300)


class Table(html.parser.HTMLParser):
    """The summary table's rows, as text cells."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[list[str]] = []
        self._in = False
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "table" and ("id", "summary") in attrs:
            self._in = True
        elif self._in and tag == "tr":
            self.rows.append([])
        elif self._in and tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag == "table":
            self._in = False
        elif self._in and tag in ("td", "th") and self._cell is not None:
            self.rows[-1].append("".join(self._cell))
            self._cell = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)


def table(page: Path) -> list[dict[str, str]]:
    t = Table()
    t.feed(page.read_text())
    head, *rows = t.rows
    return [dict(zip(head, r, strict=True)) for r in rows]


def last_sample(run_dir: Path) -> dict[str, object]:
    return json.loads((run_dir / "history.jsonl").read_text().splitlines()[-1])


def drawn(png: Path) -> int:
    rgb = np.asarray(Image.open(io.BytesIO(png.read_bytes())).convert("RGB"), dtype=np.int16)
    return int((rgb.max(axis=2) - rgb.min(axis=2) > 60).sum())


def pulled(run_dir: Path, pull_dir: Path, node: str = "gen-1") -> Path:
    """The run as `fleetdeck pull` lays it out: PULL_DIR/NODE/RUN."""
    dest = pull_dir / node / "test-run"
    shutil.copytree(run_dir, dest)
    return dest


def local_fleet(path: Path, nodes: dict[str, Path], campaign: list[str] | None = None) -> Path:
    lines = []
    for name, run_dir in nodes.items():
        lines += ["[[nodes]]", f'name = "{name}"', f'run_dir = "{run_dir}"', "local = true",
                  f'agent = "{AGENT}"', ""]
    if campaign:
        lines += ["[[campaigns]]", 'name = "traces"', f"nodes = {json.dumps(campaign)}"]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_pulled_run_gets_a_page_and_seven_pngs_that_say_what_its_history_says(
        recorded: Path, tmp_path: Path) -> None:
    pulled(recorded, tmp_path / "pulls")
    done = report(str(tmp_path / "pulls" / "gen-1"), "--to", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr
    page = tmp_path / "out" / "report.html"
    assert done.stdout.strip() == str(page)
    text = page.read_text()
    assert text.count("<svg") == len(PLOTS)
    assert "<script" not in text and 'src="http' not in text and 'href="http' not in text
    for name, *_ in PLOTS:
        png = tmp_path / "out" / "plots" / f"{name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert drawn(png) > 300, f"{name}.png has no data drawn"

    (row,) = table(page)
    last = last_sample(recorded)
    assert row["node"] == "test-run" and row["run"] == "test-run"
    assert row["status"] == last["status"] == "done"  # the end is in the history
    assert row["done / total"] == f"{last['completed']:,} / {last['total']:,}"
    assert row["failed"] == f"{last['failed']:,}"
    assert row["truncated (loops)"].startswith(f"{last['truncated']:,} "
                                               f"({last['truncated_loops']:,})")
    assert int(str(last["failed"])) > 0 and int(str(last["truncated"])) > 0  # both plotted
    assert row["GPUs"] == "2"


def test_a_node_and_a_campaign_are_read_live_through_the_agent(
        recorded: Path, tmp_path: Path) -> None:
    other = tmp_path / "other-run"
    shutil.copytree(recorded, other)
    fleet = local_fleet(tmp_path / "fleet.toml", {"gen-1": recorded, "gen-2": other},
                        campaign=["gen-1", "gen-2"])
    last = last_sample(recorded)

    done = report("gen-1", "--to", str(tmp_path / "one"), fleet=fleet)
    assert done.returncode == 0, done.stderr
    (row,) = table(tmp_path / "one" / "report.html")
    assert row["node"] == "gen-1"
    assert row["done / total"] == f"{last['completed']:,} / {last['total']:,}"

    done = report("traces", "--to", str(tmp_path / "both"), fleet=fleet)
    assert done.returncode == 0, done.stderr
    rows = table(tmp_path / "both" / "report.html")
    assert [r["node"] for r in rows] == ["gen-1", "gen-2", "traces"]
    total = int(str(last["completed"])) * 2
    assert rows[2]["done / total"] == f"{total:,} / {int(str(last['total'])) * 2:,}"
    assert "campaign traces" in (tmp_path / "both" / "report.html").read_text()


def test_hostile_history_is_escaped_counted_and_never_breaks_the_page(
        recorded: Path, tmp_path: Path) -> None:
    run = tmp_path / "pulls" / "gen-1" / "evil"
    run.mkdir(parents=True)
    lines = (recorded / "history.jsonl").read_text().splitlines()
    evil = '<script>alert(1)</script> $\\frac{1}{0}$ _hidden'
    out = []
    for i, line in enumerate(lines):
        item = json.loads(line)
        item["run"] = evil
        if i == 3:
            item["completed"] = "many"  # the wrong type: skipped and counted
        out.append(json.dumps(item))
    out.insert(5, "{not json")
    out.insert(7, "[1, 2]")
    (run / "history.jsonl").write_text("\n".join(out) + "\n")
    done = report(str(run), "--to", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr
    text = (tmp_path / "out" / "report.html").read_text()
    assert "<script" not in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    assert "gen-1/evil: 3 history lines unreadable, skipped" in text


def test_nothing_to_report_is_named(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    done = report(str(tmp_path / "empty"), "--to", str(tmp_path / "out"))
    assert done.returncode == 2
    assert f"{tmp_path / 'empty'} holds no run directory" in done.stderr
    fleet = local_fleet(tmp_path / "fleet.toml", {"gen-1": tmp_path / "empty"})
    done = report("gen-9", "--to", str(tmp_path / "out"), fleet=fleet)
    assert done.returncode == 2 and "no node named 'gen-9'" in done.stderr
    assert not (tmp_path / "out").exists()
