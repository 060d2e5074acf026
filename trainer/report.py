"""prepare_report.json and the quality gate that reads it.

The gate judges supervised tokens after masking, not the response text: the reference
project once trained on answers that were 87% empty, each still carrying 6 supervised
tokens of the template's own scaffolding (`<think>\\n\\n</think>\\n\\n<|im_end|>\\n`), which a
check for empty strings lets through.
"""

from __future__ import annotations

import time

import msgspec

REPORT_NAME = "prepare_report.json"
REPORT_VERSION = 1


class HistogramBin(msgspec.Struct):
    """Samples whose supervised token count is in [lo, hi); hi None is unbounded."""

    lo: int
    hi: int | None
    samples: int


class Problem(msgspec.Struct):
    where: str
    reason: str


class Gate(msgspec.Struct):
    passed: bool
    reason: str | None
    min_supervised: int
    max_under_min_share: float


class PrepareReport(msgspec.Struct):
    source: str
    tokenizer: str
    supervise: str
    keep_truncated: bool
    max_length: int
    block_size: int
    # Lines read, lines that could not be used (each with file:line, the first 100 kept),
    # lines replaced by a later attempt of the same index.
    lines: int
    bad_lines: int
    problems: list[Problem]
    superseded: int
    completions: int
    truncated: int
    truncated_share: float
    aborted: int
    # Samples rendered and tokenised (truncated ones only with keep_truncated).
    samples: int
    tokens: int
    supervised_tokens: int
    min_supervised: int
    under_min: int
    under_min_share: float
    tool_call: int
    tool_call_share: float
    boundary_merges: int
    histogram: list[HistogramBin]
    # Written: samples with at least min_supervised supervised tokens, by split.
    train_samples: int
    heldout_samples: int
    train_tokens: int
    gate: Gate
    # A campaign's (trainer/campaign.py): lines in the batches read that no commit names (a
    # zombie node's, a losing backup's), batch objects no commit names (not read), chunks
    # not committed yet (their indices are not in the data).
    left_out: int = 0
    unnamed_batches: int = 0
    uncommitted_chunks: int = 0
    created_at: float = msgspec.field(default_factory=time.time)
    v: int = REPORT_VERSION


report_decoder = msgspec.json.Decoder(PrepareReport)


def histogram_edges(min_supervised: int) -> list[int]:
    """0, 1, the gate's minimum, then powers of two: the bins that show an empty data set."""
    edges = {0, 1, min_supervised}
    p = 2
    while p <= 1 << 16:
        edges.add(p)
        p *= 2
    return sorted(edges)


class Histogram:
    def __init__(self, min_supervised: int) -> None:
        self.edges = histogram_edges(min_supervised)
        self.counts = [0] * len(self.edges)

    def add(self, value: int) -> None:
        i = len(self.edges) - 1
        while self.edges[i] > value:
            i -= 1
        self.counts[i] += 1

    def bins(self) -> list[HistogramBin]:
        out = []
        for i, lo in enumerate(self.edges):
            hi = self.edges[i + 1] if i + 1 < len(self.edges) else None
            if self.counts[i]:
                out.append(HistogramBin(lo, hi, self.counts[i]))
        return out


def judge(samples: int, under_min: int, min_supervised: int,
          max_under_min_share: float) -> Gate:
    if samples == 0:
        return Gate(False, "no usable samples (see problems and the truncated count)",
                    min_supervised, max_under_min_share)
    share = under_min / samples
    if share > max_under_min_share:
        return Gate(
            False,
            f"{under_min} of {samples} samples ({share:.1%}) have fewer than {min_supervised} "
            f"supervised tokens after masking (2 x block size); the limit is "
            f"{max_under_min_share:.0%} ([train] max_under_min_share). Look at the answers: "
            "empty responses still carry the template's own tokens.",
            min_supervised, max_under_min_share)
    return Gate(True, None, min_supervised, max_under_min_share)


def campaign_note(report: PrepareReport) -> str | None:
    """What of a campaign's batches was not its data, in words; None when nothing was."""
    if not (report.left_out or report.unnamed_batches or report.uncommitted_chunks):
        return None
    said = [f"{report.left_out} lines from uncommitted work left out"]
    if report.unnamed_batches:
        said.append(f"{report.unnamed_batches} batch objects no commit names not read")
    if report.uncommitted_chunks:
        said.append(f"{report.uncommitted_chunks} chunks not committed yet (their indices "
                    "are not in the data)")
    return "; ".join(said)
