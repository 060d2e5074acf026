"""The harness itself: a machine without FUSE fails (never skips), a power loss is refused while
files are open, unmount works whatever state the mount is in, the log survives a round trip."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.powerloss import oplog
from tests.powerloss.harness import REPO, ForgetfulDir, PowerLossRefused, mount, mounted
from tests.servers.ports import kill_pid


def test_a_machine_without_dev_fuse_fails_the_test(tmp_path: Path) -> None:
    """/dev/fuse hidden in a mount namespace of its own (a tmpfs over /dev, with null,
    zero and urandom bound back): the fixture's test errors out saying why."""
    old_dev = tmp_path / "dev"
    old_dev.mkdir()
    test = "tests/powerloss/test_forgetfs.py::test_a_write_without_fsync_is_gone"
    script = (f"mount --bind /dev {old_dev} && mount -t tmpfs none /dev && "
              "for f in null zero urandom; do touch /dev/$f && "
              f"mount --bind {old_dev}/$f /dev/$f; done && "
              f"exec {sys.executable} -m pytest -q -p no:xdist -p no:cacheprovider "
              f"--noconftest -p tests.powerloss.harness {test}")
    r = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
                       cwd=REPO, capture_output=True, text=True, timeout=120)
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    assert "/dev/fuse is missing" in out
    assert "1 error" in out and "skipped" not in out


def test_a_power_loss_is_refused_while_a_file_is_open(forgetful_dir: ForgetfulDir) -> None:
    path = forgetful_dir / "held"
    with open(path, "wb") as f:
        f.write(b"x")
        with pytest.raises(PowerLossRefused, match="/held"):
            forgetful_dir.power_loss(wait_s=0.2)
    forgetful_dir.power_loss()
    assert not path.exists()


def test_a_killed_writer_s_files_are_waited_for(forgetful_dir: ForgetfulDir) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import sys, time; "
                             "f = open(sys.argv[1], 'wb'); print(flush=True); time.sleep(300)",
                             str(forgetful_dir / "f")], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    proc.stdout.readline()  # the file is open
    kill_pid(proc)
    proc.stdout.close()
    forgetful_dir.power_loss()  # the kernel releases its file a moment later: waited for
    assert os.listdir(forgetful_dir) == []


def test_unmount_while_a_process_sits_in_the_mount(tmp_path: Path) -> None:
    fs = mount(tmp_path / "forgetful")
    (fs / "d").mkdir()
    proc = subprocess.Popen(["sleep", "300"], cwd=fs / "d")
    try:
        fs.unmount()  # busy: falls back to a lazy unmount
        assert not mounted(fs.path)
        assert fs.proc.poll() is not None
    finally:
        kill_pid(proc)


def test_unmount_after_the_server_was_killed(tmp_path: Path) -> None:
    fs = mount(tmp_path / "forgetful")
    fs.proc.send_signal(signal.SIGKILL)
    fs.proc.wait(timeout=10)
    assert mounted(fs.path)  # a dead mount: "Transport endpoint is not connected"
    with pytest.raises(OSError):
        os.listdir(fs.path)
    fs.unmount()
    assert not mounted(fs.path)


def test_the_log_round_trips(tmp_path: Path) -> None:
    ops = [oplog.Op("create", (1, "naïve name", 0o644)), oplog.Op("write", (2, 0, b"\0\xff")),
           oplog.Op("write", (2, 2, b"")), oplog.Op("rename", (1, "a", 1, "b")),
           oplog.Op("power_loss", ())]
    oplog.save(ops, tmp_path / "log")
    assert oplog.load(tmp_path / "log") == ops
    (tmp_path / "log" / "ops.jsonl").write_text('["write", 2]\n')
    with pytest.raises(oplog.LogError, match=r"ops\.jsonl:1: .*arity"):
        oplog.load(tmp_path / "log")
