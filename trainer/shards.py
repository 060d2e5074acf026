"""Token shards: Arrow IPC files of samples (input ids, loss mask), written and memory-mapped.

`train-00000.arrow`, `heldout-00000.arrow`, ... One row per sample: `index` (the prompt's
index in the generation run), `input_ids`, `loss_mask`, `prompt_len` (tokens before the
generated turn), `supervised`, `truncated`, `tool_call`. Uncompressed, so that training
maps the files instead of loading them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from trainer.render import Sample

SCHEMA = pa.schema([
    ("index", pa.int64()),
    ("input_ids", pa.list_(pa.int32())),
    ("loss_mask", pa.list_(pa.uint8())),
    ("prompt_len", pa.int32()),
    ("supervised", pa.int32()),
    ("truncated", pa.bool_()),
    ("tool_call", pa.bool_()),
])
SPLITS = ("train", "heldout")


class ShardError(ValueError):
    pass


@dataclass(frozen=True)
class Row:
    index: int
    input_ids: np.ndarray
    loss_mask: np.ndarray
    prompt_len: int


class ShardWriter:
    """Appends samples of one split, in record batches, to numbered files."""

    def __init__(self, folder: Path, split: str, rows_per_file: int = 50_000,
                 rows_per_batch: int = 512) -> None:
        self.folder = folder
        self.split = split
        self.rows_per_file = rows_per_file
        self.rows_per_batch = rows_per_batch
        self.rows = 0
        self.tokens = 0
        self.files: list[Path] = []
        self._pending: list[tuple[int, Sample, bool, bool]] = []
        self._writer: ipc.RecordBatchFileWriter | None = None
        self._in_file = 0

    def add(self, index: int, sample: Sample, truncated: bool, tool_call: bool) -> None:
        self._pending.append((index, sample, truncated, tool_call))
        self.rows += 1
        self.tokens += len(sample.input_ids)
        if len(self._pending) >= self.rows_per_batch:
            self._flush()

    def _flush(self) -> None:
        if not self._pending:
            return
        if self._writer is None or self._in_file >= self.rows_per_file:
            self._close_file()
            path = self.folder / f"{self.split}-{len(self.files):05d}.arrow"
            self.files.append(path)
            self._writer = ipc.new_file(str(path), SCHEMA)
            self._in_file = 0
        rows = self._pending
        batch = pa.record_batch([
            pa.array([r[0] for r in rows], pa.int64()),
            pa.array([r[1].input_ids for r in rows], pa.list_(pa.int32())),
            pa.array([r[1].loss_mask for r in rows], pa.list_(pa.uint8())),
            pa.array([r[1].prompt_len for r in rows], pa.int32()),
            pa.array([r[1].supervised for r in rows], pa.int32()),
            pa.array([r[2] for r in rows], pa.bool_()),
            pa.array([r[3] for r in rows], pa.bool_()),
        ], schema=SCHEMA)
        self._writer.write_batch(batch)
        self._in_file += len(rows)
        self._pending = []

    def _close_file(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def close(self) -> None:
        self._flush()
        self._close_file()


class ShardSet:
    """The samples of one split, memory-mapped, with random access by row."""

    def __init__(self, folder: Path, split: str) -> None:
        self.paths = sorted(folder.glob(f"{split}-*.arrow"))
        tables = []
        for path in self.paths:
            try:
                tables.append(ipc.open_file(pa.memory_map(str(path), "r")).read_all())
            except (OSError, pa.ArrowInvalid) as exc:
                raise ShardError(f"{path}: not a readable Arrow IPC shard: {exc}") from None
        table = pa.concat_tables(tables) if tables else SCHEMA.empty_table()
        # Chunks stay as mapped; a row is found by bisecting the chunk starts (combining
        # the chunks would copy the whole data set into memory).
        self._ids = table.column("input_ids").chunks
        self._mask = table.column("loss_mask").chunks
        self._starts = np.cumsum([0] + [len(c) for c in self._ids])
        self._index = table.column("index").to_numpy()
        self._prompt = table.column("prompt_len").to_numpy()
        self.supervised = table.column("supervised").to_numpy()

    def __len__(self) -> int:
        return len(self._index)

    def row(self, i: int) -> Row:
        c = int(np.searchsorted(self._starts, i, side="right")) - 1
        j = i - int(self._starts[c])
        ids = self._ids[c][j].values.to_numpy(zero_copy_only=False)
        mask = self._mask[c][j].values.to_numpy(zero_copy_only=False)
        return Row(int(self._index[i]), ids.astype(np.int64), mask.astype(np.bool_),
                   int(self._prompt[i]))
