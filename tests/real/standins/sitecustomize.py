"""A guard for the real-server test tier only: PyPI's torchvision next to the CPU torch.

The torchvision 0.28 wheel on PyPI is a CUDA build. Beside torch 2.13.0+cpu its compiled ops
(`torchvision::nms`, `roi_align`, ...) do not load, and `import torchvision` then dies in
`torchvision/_meta_registrations.py`, whose `torch.library.register_fake("torchvision::nms")`
raises "operator torchvision::nms does not exist". SGLang imports torchvision at start-up
(transformers' image utilities, `sglang.srt.multimodal`), though a text model never calls it.

This file is on the SGLang server's PYTHONPATH (put there by `tests/real/env.py`), so Python
imports it at start-up: fake registrations for torchvision ops that do not exist are skipped,
and everything else goes to torch unchanged. torchvision's ops themselves stay absent; calling
one fails as it would without this guard.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.library

_register_fake = torch.library.register_fake


def _op_exists(qualname: str) -> bool:
    namespace, _, name = qualname.partition("::")
    try:
        getattr(getattr(torch.ops, namespace), name.split(".")[0])
    except (AttributeError, RuntimeError):
        return False
    return True


def register_fake(op: Any, *args: Any, **kwargs: Any) -> Any:
    if isinstance(op, str) and op.startswith("torchvision::") and not _op_exists(op):
        def skip(fn: Any = None, /) -> Any:
            return fn if fn is not None else (lambda f: f)
        # register_fake(op, fn) registers at once; register_fake(op) returns a decorator.
        return args[0] if args and callable(args[0]) else skip
    return _register_fake(op, *args, **kwargs)


torch.library.register_fake = register_fake
