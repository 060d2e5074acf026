"""The sha256 pull takes while sftp writes a part (console/artifacts/pull.py `Hashed`): it
reads only what arrived since its last look, and the check at the end trusts it only where it
matches; a part whose early bytes were read before sftp filled them (a hole after a short
read, a rewrite) is hashed again whole, so it is neither refused wrongly nor accepted."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from console.artifacts.landing import EARLY_MIN, Hashed, finish_part

SIZE = EARLY_MIN * 3 + 12345


def test_a_part_hashed_as_it_grew_is_accepted_and_durable(tmp_path: Path) -> None:
    data = os.urandom(SIZE)
    part, final = tmp_path / "f.fdpart", tmp_path / "f"
    early = Hashed()
    with open(part, "wb") as f:
        for at in range(0, SIZE, EARLY_MIN // 2 + 7):  # sftp's writes, looked at between
            f.write(data[at:at + EARLY_MIN // 2 + 7])
            f.flush()
            early.more(part, SIZE)
    assert 0 < early.upto < SIZE  # it read as the part grew, the tail is left to the end
    assert finish_part(part, final, SIZE, hashlib.sha256(data).hexdigest(), early)
    assert final.read_bytes() == data and not part.exists()


def test_bytes_read_before_sftp_filled_them_are_hashed_again(tmp_path: Path) -> None:
    data = os.urandom(SIZE)
    part, final = tmp_path / "f.fdpart", tmp_path / "f"
    with open(part, "wb") as f:
        f.write(bytes(EARLY_MIN * 2))  # a hole: zeros where the data has not come yet
    early = Hashed()
    early.more(part, SIZE)
    assert early.upto == EARLY_MIN * 2
    part.write_bytes(data)  # sftp fills it
    assert finish_part(part, final, SIZE, hashlib.sha256(data).hexdigest(), early)
    assert final.read_bytes() == data


def test_a_wrong_part_is_refused_whatever_was_hashed_early(tmp_path: Path) -> None:
    data = os.urandom(SIZE)
    part, final = tmp_path / "f.fdpart", tmp_path / "f"
    part.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    early = Hashed()
    early.more(part, SIZE)
    assert not finish_part(part, final, SIZE, hashlib.sha256(data).hexdigest(), early)
    assert not part.exists() and not final.exists()


def test_a_part_longer_than_the_manifest_is_cut_and_checked(tmp_path: Path) -> None:
    """A log still growing on the node: the manifest's sha256 is of its first `size` bytes,
    and the early hash stops there too."""
    data = os.urandom(SIZE)
    part, final = tmp_path / "f.fdpart", tmp_path / "f"
    part.write_bytes(data + b"more log lines\n")
    early = Hashed()
    early.more(part, SIZE)
    assert early.upto <= SIZE
    assert finish_part(part, final, SIZE, hashlib.sha256(data).hexdigest(), early)
    assert final.read_bytes() == data
