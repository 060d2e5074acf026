"""prepare_report.json and the quality gate that reads it.

The gate judges supervised tokens after masking, not the response text: the reference
project once trained on answers that were 87% empty, each still carrying 6 supervised
tokens of the template's own scaffolding (`<think>\\n\\n</think>\\n\\n<|im_end|>\\n`), which a
check for empty strings lets through.
"""

from __future__ import annotations

import math
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


class Lengths(msgspec.Struct):
    """Sample lengths in tokens, before `max_length` cut them, and what the cut cost: `cut`
    samples lost their ending (`<|im_end|>`, and the rest of the answer), `lost_answer` of
    them the whole final answer (the cut falls in the reasoning)."""

    max_length: int
    # Set in [train] (or --max-length): the gate lets any cut through.
    explicit: bool
    cut: int
    cut_share: float
    lost_answer: int
    p50: int
    p90: int
    p99: int
    longest: int
    # The longest sample as training sees it (after the cut): the memory plan's length.
    longest_kept: int
    max_cut_share: float


def percentile(values: list[int], q: float) -> int:
    """The nearest-rank percentile of `values` (sorted), 0 for none."""
    if not values:
        return 0
    rank = max(1, math.ceil(q / 100 * len(values)))
    return values[rank - 1]


def lengths_of(lengths: list[int], max_length: int, explicit: bool, lost_answer: int,
               max_cut_share: float) -> Lengths:
    ordered = sorted(lengths)
    cut = sum(1 for n in ordered if n > max_length)
    return Lengths(max_length, explicit, cut, cut / len(ordered) if ordered else 0.0,
                   lost_answer, percentile(ordered, 50), percentile(ordered, 90),
                   percentile(ordered, 99), ordered[-1] if ordered else 0,
                   min(ordered[-1], max_length) if ordered else 0, max_cut_share)


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
    # Lengths before the cut and what max_length cut (None in reports from before it).
    lengths: Lengths | None = None
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
          max_under_min_share: float, lengths: Lengths | None = None) -> Gate:
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
    if lengths is not None and not lengths.explicit and lengths.cut_share > lengths.max_cut_share:
        return Gate(
            False,
            f"{lengths.cut} of {samples} samples ({lengths.cut_share:.1%}) are longer than "
            f"max_length {lengths.max_length} tokens and would lose their ending (the rest "
            f"of the answer and <|im_end|>; {lengths.lost_answer} the whole answer); the "
            f"limit is {lengths.max_cut_share:.0%} ([train] max_cut_share). Lengths: p50 "
            f"{lengths.p50}, p90 {lengths.p90}, p99 {lengths.p99}, longest {lengths.longest}. "
            "Set [train] max_length explicitly (e.g. the p99) to train with that cut.",
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
