"""The DFlash loss step's peak memory and speed: chunked LM head against the one-piece loss.

The loss step is the LM head over every labelled block position, cross-entropy in fp32, and
its backward to the drafter's last hidden states. The baseline, measured in the same run, is
the loss as it was before chunking (the head over all positions at once, then `.float()`:
[positions, vocab] fp32 logits, their log-softmax and gradient all alive at the peak). Ours is
`trainer.objective.head_cross_entropy` (a chunk of positions at a time, each chunk's gradient
computed while its logits exist, only that kept for the backward). Peak memory is torch's
own count of live tensor bytes (torch.profiler, profile_memory), CPU, fp32.

    .venv/bin/python benchmarks/loss.py [--vocab 151936] [--batch 2] [--anchors 32]
                                        [--hidden 512] [--chunk 128]

At the real size (4 x 512 anchors x 15 positions, vocab 151,936) the one-piece logits alone
are ~18.7 GB; the default here keeps the anchors few so that the baseline fits a small CPU
box, at the real vocabulary.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.trainer.peakmem import peak_bytes
from trainer.objective import head_cross_entropy

Loss = Callable[[torch.Tensor, torch.nn.Linear, torch.Tensor, torch.Tensor], torch.Tensor]


def one_piece(hidden: torch.Tensor, head: torch.nn.Linear, target: torch.Tensor,
              w: torch.Tensor) -> torch.Tensor:
    """The loss before chunking (trainer/objective.py until issue 24)."""
    logits = head(hidden).float()
    ce = F.cross_entropy(logits, target, reduction="none")
    _ = logits.argmax(dim=-1) == target  # the stats read the same logits
    return (ce * w).sum() / w.sum()


def measure(loss_fn: Loss, hidden: torch.Tensor, head: torch.nn.Linear, target: torch.Tensor,
            w: torch.Tensor, repeats: int) -> tuple[int, float, float, torch.Tensor]:
    """Peak live bytes of one forward and backward, its seconds (best of `repeats`), the loss
    and the gradient."""
    h = hidden.detach().requires_grad_(True)
    with peak_bytes() as peak:
        loss = loss_fn(h, head, target, w)
        loss.backward()
    grad = h.grad
    assert grad is not None
    best = float("inf")
    for _ in range(repeats):
        h.grad = None
        t0 = time.perf_counter()
        loss_fn(h, head, target, w).backward()
        best = min(best, time.perf_counter() - t0)
    return peak.bytes, best, float(loss.detach()), grad


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--vocab", type=int, default=151_936)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--anchors", type=int, default=32)
    ap.add_argument("--block", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--chunk", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    n = args.batch * args.anchors * (args.block - 1)
    head = torch.nn.Linear(args.hidden, args.vocab, bias=False).requires_grad_(False)
    hidden = torch.randn(n, args.hidden)
    target = torch.randint(0, args.vocab, (n,))
    w = torch.rand(n) + 0.1

    def chunked(h: torch.Tensor, hd: torch.nn.Linear, t: torch.Tensor,
                ww: torch.Tensor) -> torch.Tensor:
        total, _, _ = head_cross_entropy(h, hd, t, ww, args.chunk)
        return total / ww.sum()

    base_peak, base_s, base_loss, base_grad = measure(one_piece, hidden, head, target, w,
                                                      args.repeats)
    peak, secs, loss, grad = measure(chunked, hidden, head, target, w, args.repeats)
    diff = float((grad - base_grad).abs().max())
    logits_gib = n * args.vocab * 4 / 2**30
    print(f"loss step     {n} positions ({args.batch} x {args.anchors} anchors x "
          f"{args.block - 1}), vocab {args.vocab}, hidden {args.hidden}, fp32, CPU, "
          f"{args.threads} thread(s); one-piece logits {logits_gib:.2f} GiB")
    print(f"  one-piece (baseline)   peak {base_peak / 2**20:9.1f} MiB   {base_s:7.3f} s")
    print(f"  chunked ({args.chunk:5d} rows)   peak {peak / 2**20:9.1f} MiB   {secs:7.3f} s   "
          f"memory x{peak / base_peak:.3g}, speed x{base_s / secs:.3g}")
    print(f"  same loss and gradient: |loss diff| {abs(loss - base_loss):.2e}, "
          f"max |grad diff| {diff:.2e}")
    if abs(loss - base_loss) > 1e-5 * max(1.0, abs(base_loss)) or diff > 1e-5:
        print("chunked loss differs from the one-piece loss", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
