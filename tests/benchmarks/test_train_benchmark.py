"""The training benchmark at a smoke size, a process of its own, so that it cannot silently
break (its figures are for the report, not pass/fail): the smallest target it allows (8
layers, width 32: no teaching, no tau), 3 timed steps, and the attention variants at 256
tokens x 16 anchors instead of the paper's 3,072 x 512."""

from __future__ import annotations

from tests.benchmarks.smoke import ratios, run_bench

NUM = r"(\d+(?:\.\d+)?)"


def test_train() -> None:
    out = run_bench("train.py", "--steps", "3", "--hidden", "32", "--attention-hidden", "64",
                    "--attention-tokens", "256", "--attention-anchors", "16")
    ratios(out, rf"target forward alone +\d+ tokens/s +ratio {NUM}")
    ratios(out, rf"naive per-block loop +\d+ blocks/s +ratio {NUM}")
    assert "attention     256 tokens, 16 anchors x block 16" in out, out
    # A variant that fails is printed, not raised: each of the four must have run.
    assert " failed: " not in out, out
    ratios(out, rf"memory x{NUM}, speed x{NUM}", count=8)


def test_loss() -> None:
    """The chunked loss against the one-piece loss, at a vocab of 8,192 and 4 anchors (the
    figure that counts is at 151,936: benchmarks/README.md)."""
    out = run_bench("loss.py", "--vocab", "8192", "--anchors", "4", "--hidden", "64",
                    "--chunk", "16", "--repeats", "1")
    ratios(out, rf"memory x{NUM}, speed x{NUM}", count=2)
    assert "same loss and gradient" in out, out
