"""How the drafter's state is held across ranks: replicated (DDP) or sharded (FSDP2).

Replicated, every rank keeps the drafter's fp32 weights, their gradients and AdamW's two
moments: 16 bytes a parameter, on every GPU. Sharded (`fully_shard`, each decoder layer a
unit of its own, then the rest), every rank keeps 1/world of them; the compute runs in bf16
on GPUs with fp32 master weights and fp32 gradient reduction. `[train] shard` chooses:
"never", "always", or "auto" (`needs_sharding`: when the replicated state would take more
than a quarter of a GPU, the rest being the target's and the activations').
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from trainer.distributed import Dist

SHARD_MODES = ("auto", "always", "never")
# fp32 weights (4) + fp32 gradients (4) + AdamW's exp_avg and exp_avg_sq (8).
REPLICATED_BYTES_PER_PARAM = 16
# The share of a GPU the drafter's replicated state may take before "auto" shards it.
REPLICATED_SHARE = 0.25


class ShardError(ValueError):
    """A shard setting that cannot be honoured (exit 2)."""


def replicated_bytes(params: int) -> int:
    return params * REPLICATED_BYTES_PER_PARAM


def needs_sharding(params: int, device_bytes: int | None) -> bool:
    """Whether replicating `params` parameters with AdamW would crowd a device of
    `device_bytes` (None: host memory, never short here)."""
    return device_bytes is not None and replicated_bytes(params) > REPLICATED_SHARE * device_bytes


def device_bytes(device: torch.device) -> int | None:
    if device.type != "cuda":
        return None
    return int(torch.cuda.get_device_properties(device).total_memory)


def decide(mode: str, params: int, d: Dist) -> bool:
    """Shard or not, for `[train] shard` = `mode` on this group (one process: nothing to
    shard)."""
    if mode not in SHARD_MODES:
        raise ShardError(f"[train] shard: {mode!r}, expected one of {', '.join(SHARD_MODES)}")
    if not d.enabled or mode == "never":
        return False
    return mode == "always" or needs_sharding(params, device_bytes(d.device))


def shard(drafter: nn.Module, d: Dist, compute: torch.dtype) -> None:
    """`fully_shard` the drafter in place: every decoder layer, then the root (fc, norms).
    Parameters stay fp32 (the master weights AdamW updates); `compute` is what forward and
    backward run in, gradients are reduced in fp32."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh(d.device.type, (d.world,))
    policy = MixedPrecisionPolicy(
        param_dtype=compute if compute != torch.float32 else None,
        reduce_dtype=torch.float32)
    layers = getattr(drafter, "layers", None)
    if isinstance(layers, nn.ModuleList):
        for layer in layers:
            fully_shard(layer, mesh=mesh, mp_policy=policy)
    fully_shard(drafter, mesh=mesh, mp_policy=policy)


def replicate(drafter: nn.Module, d: Dist) -> nn.Module:
    """DDP around the drafter (one process: the drafter itself)."""
    if not d.enabled:
        return drafter
    return nn.parallel.DistributedDataParallel(
        drafter, device_ids=[d.device.index] if d.device.type == "cuda" else None)


def is_sharded(drafter: nn.Module) -> bool:
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in drafter.parameters())


# The drafter's weights and the optimizer's state, by parameter name.
FullState = tuple[dict[str, Any], dict[str, Any]]


def full_state(drafter: nn.Module, opt: torch.optim.Optimizer, d: Dist, sharded: bool
               ) -> FullState | None:
    """The drafter's full weights and optimizer state (names, not parameter indices, so
    they load into any layout), on the lead, on the CPU; None on the other ranks. Sharded,
    every rank takes part in the gathers."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    if not sharded:
        if not d.main:
            return None
        model_sd, optim_sd = get_state_dict(drafter, opt)
        return _to_cpu(model_sd), _to_cpu(optim_sd)
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    full: FullState = get_state_dict(drafter, opt, options=options)
    # The gathers leave the whole state on global rank 0; the lead (node 0's first process,
    # which c10d may have numbered otherwise) is the one that writes it.
    if d.lead != 0:
        box: list[Any] = [full]
        if d.rank == 0:
            dist.send_object_list(box, dst=d.lead)
        elif d.main:
            dist.recv_object_list(box, src=0)
            full = box[0]
    return full if d.main else None


def _to_cpu(state: dict[str, Any]) -> dict[str, Any]:
    def move(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return value.detach().cpu()
        if isinstance(value, dict):
            return {k: move(v) for k, v in value.items()}
        if isinstance(value, list):
            return [move(v) for v in value]
        return value

    return {k: move(v) for k, v in state.items()}
