"""A campaign's prefix as S3 holds it, read with boto3 (not through the product's queue code):
what the end-to-end tests check the nodes' and the console's figures against."""

from __future__ import annotations

import json
from typing import Any

from tests.servers.s3 import S3Server


class PrefixReader:
    """Mixed into a test's record of a campaign that has `s3` and `prefix`."""

    s3: S3Server
    prefix: str

    def listing(self, under: str = "") -> list[str]:
        client = self.s3.client()
        out: list[str] = []
        for page in client.get_paginator("list_objects_v2").paginate(
                Bucket=self.s3.bucket, Prefix=self.prefix + under):
            out += [item["Key"] for item in page.get("Contents", [])]
        return out

    def read(self, key: str) -> bytes:
        body: bytes = self.s3.client().get_object(Bucket=self.s3.bucket, Key=key)["Body"].read()
        return body

    def commits(self, generation: int) -> dict[int, dict[str, Any]]:
        """Chunk -> its commit object."""
        return {int(k.rsplit("/", 1)[1]): json.loads(self.read(k))
                for k in self.listing(f"commits/gen-{generation:04d}/")}


def indices(ranges: list[list[int]]) -> set[int]:
    return {i for a, b in ranges for i in range(a, b)}


def union(commits: dict[int, dict[str, Any]], field: str, node: str | None = None) -> set[int]:
    """The indices every commit (of `node`, if given) lists under `field`."""
    return set().union(*(indices(c[field]) for c in commits.values()
                         if node is None or c["node"] == node))
