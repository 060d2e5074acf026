"""A local folder that holds a pulled copy of an S3 prefix (`aws s3 sync`: a key is the path
under the folder), answering the few reads the queue's records are read with
(`agents/queue/s3ops.py`: GetObject with a Range, ListObjectsV2, HeadObject) as S3 would, so
a pulled campaign is judged by the same code as the one in S3."""

from __future__ import annotations

import io
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from botocore.exceptions import ClientError


class FolderStore:
    def __init__(self, root: Path) -> None:
        self.root = root

    def _path(self, key: str) -> Path:
        parts = key.split("/")
        if any(p in ("", ".", "..") for p in parts):
            raise self._missing(key, "GetObject")
        return self.root.joinpath(*parts)

    def _missing(self, key: str, op: str) -> ClientError:
        error = {"Code": "NoSuchKey", "Message": f"{self.root / key}: no such file"}
        answer: Any = {"Error": error, "ResponseMetadata": {"HTTPStatusCode": 404}}
        return ClientError(answer, op)

    @staticmethod
    def _etag(path: Path) -> tuple[int, str, datetime]:
        st = path.stat()
        # Not an MD5: nothing compares it with one, only with itself.
        return (st.st_size, f'"{st.st_size:x}-{st.st_mtime_ns:x}"',
                datetime.fromtimestamp(st.st_mtime, tz=UTC))

    def head_object(self, *, Bucket: str, Key: str, **kw: Any) -> dict[str, Any]:
        path = self._path(Key)
        if not path.is_file():
            raise self._missing(Key, "HeadObject")
        size, etag, mtime = self._etag(path)
        return {"ContentLength": size, "ETag": etag, "LastModified": mtime}

    def get_object(self, *, Bucket: str, Key: str, Range: str | None = None,
                   **kw: Any) -> dict[str, Any]:
        path = self._path(Key)
        try:
            data = path.read_bytes()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise self._missing(Key, "GetObject") from None
        if Range is not None and Range.startswith("bytes="):
            start, _, end = Range[len("bytes="):].partition("-")
            data = data[int(start): int(end) + 1 if end else None]
        _, etag, mtime = self._etag(path)
        return {"Body": io.BytesIO(data), "ContentLength": len(data), "ETag": etag,
                "LastModified": mtime}

    def list_objects_v2(self, *, Bucket: str, Prefix: str = "", **kw: Any
                        ) -> dict[str, Any]:
        """Every file whose key starts with Prefix, in key order, on one page."""
        folder = Prefix.rpartition("/")[0]
        base = self.root.joinpath(*folder.split("/")) if folder else self.root
        found: list[dict[str, Any]] = []
        if base.is_dir():
            for path in base.rglob("*"):
                if not path.is_file():
                    continue
                key = path.relative_to(self.root).as_posix()
                if key.startswith(Prefix):
                    size, etag, mtime = self._etag(path)
                    found.append({"Key": key, "Size": size, "ETag": etag, "LastModified": mtime})
        found.sort(key=lambda o: o["Key"])
        return {"Contents": found, "KeyCount": len(found), "IsTruncated": False}
