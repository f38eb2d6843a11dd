"""The environment of each worker of a training gang: what ``torchrun`` and
``torch.distributed`` read (MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK, LOCAL_RANK,
LOCAL_WORLD_SIZE, NODE_RANK/GROUP_RANK) plus gpupool's own (GPUs, memory cap, checkpoint
folder, attempt). Plain functions so the embedded runner and the Kubernetes manifest
builder give workers the same names."""

from __future__ import annotations

import socket
from collections.abc import Sequence

from scheduler.model import PodPlacement


def ranks(pods: Sequence[PodPlacement]) -> list[tuple[int, int, int]]:
    """Per pod, in gang order: (node_rank, local_rank, local_world_size). Nodes are
    numbered in the order their first pod appears."""
    node_order: dict[str, int] = {}
    seen: dict[str, int] = {}
    for p in pods:
        node_order.setdefault(p.node, len(node_order))
    per_node = {n: sum(1 for p in pods if p.node == n) for n in node_order}
    out = []
    for p in pods:
        local = seen.get(p.node, 0)
        seen[p.node] = local + 1
        out.append((node_order[p.node], local, per_node[p.node]))
    return out


def distributed_env(rank: int, world_size: int, node_rank: int, local_rank: int,
                    local_world_size: int, master_addr: str, master_port: int,
                    restart_count: int = 0, run_id: str = "") -> dict[str, str]:
    return {
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
        "WORLD_SIZE": str(world_size),
        "RANK": str(rank),
        "LOCAL_RANK": str(local_rank),
        "LOCAL_WORLD_SIZE": str(local_world_size),
        "NODE_RANK": str(node_rank),
        "GROUP_RANK": str(node_rank),
        "ROLE_RANK": str(rank),
        "TORCHELASTIC_RESTART_COUNT": str(restart_count),
        "TORCHELASTIC_RUN_ID": run_id,
    }


def gang_env(pods: Sequence[PodPlacement], master_addr: str, master_port: int,
             restart_count: int = 0, run_id: str = "") -> list[dict[str, str]]:
    """The distributed environment of every worker of a placed gang."""
    return [
        distributed_env(rank, len(pods), node_rank, local_rank, local_world, master_addr,
                        master_port, restart_count, run_id)
        for rank, (node_rank, local_rank, local_world) in enumerate(ranks(pods))
    ]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
