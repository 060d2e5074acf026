"""How `fleetdeck-train train` runs under torchrun (without importing torch: it execs it).

One node: `torchrun --standalone --nproc_per_node N` (`[train] nproc`). Several nodes
(`[train] nodes`, `node_rank`, `rdzv_endpoint`): each node runs `fleetdeck-train train`, which
becomes `torchrun --nnodes N --node-rank R --rdzv-backend c10d --rdzv-endpoint HOST:PORT`.
"""

from __future__ import annotations

import os
import sys


def under_torchrun() -> bool:
    return "LOCAL_RANK" in os.environ and "WORLD_SIZE" in os.environ


def torchrun_command(argv: list[str], nproc: int, nodes: int = 1, node_rank: int = 0,
                     rdzv_endpoint: str | None = None, run_id: str = "fleetdeck",
                     join_timeout_s: float = 1800.0, node_timeout_s: float = 30.0
                     ) -> list[str]:
    """The torchrun command that runs `python -m trainer.cli ARGV` on this node: standalone
    on one node; on several, c10d's rendezvous at node 0 (which hosts its store, so that two
    nodes on one host do not both try to), no restarts (a lost node stops the job; `resume`
    goes on), the rendezvous's store reads as short as the node timeout."""
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}"]
    if nodes <= 1:
        return [*cmd, "--standalone", "-m", "trainer.cli", *argv]
    conf = (f"is_host={1 if node_rank == 0 else 0},join_timeout={max(1, round(join_timeout_s))},"
            f"read_timeout={max(1, round(node_timeout_s))}")
    return [*cmd, f"--nnodes={nodes}", f"--node-rank={node_rank}", "--rdzv-backend=c10d",
            f"--rdzv-endpoint={rdzv_endpoint}", f"--rdzv-id={run_id}", f"--rdzv-conf={conf}",
            "--max-restarts=0", "-m", "trainer.cli", *argv]
