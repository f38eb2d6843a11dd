"""Where one pod goes: placement policies over ``ClusterArrays``.

A policy sees every node at once (a boolean ``mask`` of the nodes whose pool, model, CPU
and memory already allow the pod) and returns the node, the GPU slots and the milli-GPUs
per slot, or None when no node can hold the pod. Policies never change the arrays.

A policy may also have ``prepare(demands)``: the core calls it once per cycle with the
demands of the pending and running workloads, so a fragmentation-aware policy knows the
workload mix it should keep room for. The scoring policies live in ``scheduler.policies``.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from .cluster import ClusterArrays
from .model import MILLI, PodDemand
from .policies import FGD, BestFit, Choice, GpupoolKeepWhole, GpupoolPolicy, RandomFit

__all__ = ["Choice", "PlacementPolicy", "POLICIES", "get_policy"]


class PlacementPolicy(Protocol):
    name: str

    def place(self, arrays: ClusterArrays, mask: np.ndarray, demand: PodDemand) -> Choice | None: ...


class TightPack:
    """Packs work tight without a score: whole GPUs on the nodes with fewest free GPUs,
    fractions on the GPU with least room left, CPU-only pods off the GPU nodes."""

    name = "tightpack"

    def __init__(self, seed: int | None = None):
        del seed  # deterministic

    def place(self, arrays: ClusterArrays, mask: np.ndarray, demand: PodDemand) -> Choice | None:
        if demand.gpus:
            ok = mask & (arrays.full_free >= demand.gpus)
            if not ok.any():
                return None
            score = np.where(ok, arrays.full_free, np.iinfo(np.int16).max)
            node = int(np.argmin(score))
            slots = np.flatnonzero(arrays.gpu_free[node] == MILLI)[: demand.gpus]
            return Choice(node, tuple(int(s) for s in slots), MILLI)
        if demand.is_fractional:
            need = arrays.need_milli(demand)
            fits = (arrays.gpu_free >= need) & mask[:, None]
            if not fits.any():
                return None
            left = np.where(fits, arrays.gpu_free - need, MILLI + 1)
            flat = int(np.argmin(left))
            node, slot = divmod(flat, arrays.gpu_free.shape[1])
            milli = int(need if np.isscalar(need) else need[node, slot])
            return Choice(node, (slot,), milli)
        if not mask.any():
            return None
        score = np.where(mask, arrays.cpu_free + (arrays.gpu_count > 0) * (1 << 40), np.iinfo(np.int64).max)
        return Choice(int(np.argmin(score)), (), 0)


# One registry, in the order the README table lists them: the paper's baselines from the
# weakest up, then gpupool's own. "gpupool" is the policy the scheduler core uses by default.
# Every class takes an optional ``seed``: None (the scheduler) breaks ties by lowest node
# index, deterministically; a seed (the simulator) breaks them at random, as Kubernetes does.
POLICIES: dict[str, type] = {
    "random": RandomFit,
    "tightpack": TightPack,
    "bestfit": BestFit,
    "fgd": FGD,
    "gpupool": GpupoolPolicy,
    "gpupool-keepwhole": GpupoolKeepWhole,
}


def get_policy(name: str, seed: int | None = None) -> PlacementPolicy:
    try:
        cls = POLICIES[name]
    except KeyError:
        raise ValueError(f"policy: unknown placement policy {name!r}; choose one of {sorted(POLICIES)}") from None
    return cls(seed=seed)
