"""A stand-in for SGLang's kernel library (`sgl_kernel`), for the real-server test tier only.

No PyPI wheel carries the CPU build of `sgl_kernel` (`sgl-kernel` / `sglang-kernel` are CUDA
builds). SGLang 0.5.23 on a CPU without AMX (`SGLANG_USE_CPU_ENGINE=1 --device cpu`, torch-native
attention and sampling) still imports names from it when its modules load. Exactly one of them
is called on the path the tier uses: `assign_req_to_token_pool_cpu`, written out below from the
Triton kernel it replaces (`sglang/srt/mem_cache/allocation.py`, `assign_req_to_token_pool`).
Every other top-level name resolves to a function that raises when called, naming itself, so
a code path that would need a real kernel fails loudly instead of computing something wrong.
Submodules (`sgl_kernel.scalar_type`, `sgl_kernel.flash_attn`, ...) are left absent: SGLang
guards those imports and falls back (a stand-in module there would be taken for the real one).

This is not fleetdeck code and never ships: it lives in the test tree and is put on the
server's PYTHONPATH by `tests/real/env.py`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__version__ = "0.0.0+fleetdeck.standin"


def assign_req_to_token_pool_cpu(req_pool_indices: Any, req_to_token: Any, start_offset: Any,
                                 end_offset: Any, out_cache_loc: Any, pool_len: int) -> None:
    """For each request i of the batch: req_to_token[req_pool_indices[i], start:end] takes the
    next (end - start) slots of out_cache_loc, in batch order (the Triton kernel's cumsum)."""
    del pool_len  # the row length; the kernel needs it for pointer arithmetic, torch does not
    taken = 0
    rows = req_pool_indices.tolist()
    starts = start_offset.tolist()
    ends = end_offset.tolist()
    for row, start, end in zip(rows, starts, ends, strict=True):
        n = end - start
        req_to_token[row, start:end] = out_cache_loc[taken:taken + n]
        taken += n


class StandInCalled(RuntimeError):
    """A kernel the stand-in does not provide was called: the tier reached a path (speculative
    decoding, quantisation, MoE, ...) that needs the real sgl_kernel."""


def _absent(qualname: str) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        raise StandInCalled(f"sgl_kernel stand-in: {qualname} was called; the real-server "
                            "tier only covers paths that need no sgl_kernel kernel")
    call.__name__ = qualname.rsplit(".", 1)[-1]
    call.__qualname__ = qualname
    return call


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    return _absent(f"{__name__}.{name}")
