"""Where one pod goes: placement policies over ``ClusterArrays``.

A policy sees every node at once (a boolean ``mask`` of the nodes whose pool, model, CPU
and memory already allow the pod) and returns the node, the GPU slots and the milli-GPUs
per slot, or None when no node can hold the pod. Policies never change the arrays.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from .cluster import ClusterArrays
from .model import MILLI, PodDemand


@dataclass(frozen=True)
class Choice:
    node: int
    gpus: tuple[int, ...]
    milli: int  # per GPU


class PlacementPolicy(Protocol):
    name: str

    def place(self, arrays: ClusterArrays, mask: np.ndarray, demand: PodDemand) -> Choice | None: ...


def _fit_slots(arrays: ClusterArrays, mask: np.ndarray, demand: PodDemand):
    """(node rows, need per slot, fits per slot) for a single-GPU fractional pod."""
    need = arrays.need_milli(demand)
    fits = (arrays.gpu_free >= need) & mask[:, None]
    return need, fits


class BestFit:
    """Packs work tight: whole GPUs on the nodes with fewest free GPUs, fractions on the
    GPU with least room left. The simple baseline; ``scheduler.policies`` has the rest."""

    name = "bestfit"

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
            need, fits = _fit_slots(arrays, mask, demand)
            if not fits.any():
                return None
            left = np.where(fits, arrays.gpu_free - need, MILLI + 1)
            flat = int(np.argmin(left))
            node, slot = divmod(flat, arrays.gpu_free.shape[1])
            milli = int(need if np.isscalar(need) else need[node, slot])
            return Choice(node, (slot,), milli)
        # CPU-only: keep GPU nodes' CPUs for GPU work when a node without GPUs can take it.
        if not mask.any():
            return None
        score = np.where(mask, arrays.cpu_free + (arrays.gpu_count > 0) * (1 << 40), np.iinfo(np.int64).max)
        return Choice(int(np.argmin(score)), (), 0)


# "gpupool" is the policy the scheduler core uses by default.
POLICIES: dict[str, type] = {"bestfit": BestFit, "gpupool": BestFit}


def get_policy(name: str) -> PlacementPolicy:
    try:
        return POLICIES[name]()
    except KeyError:
        raise ValueError(f"policy: unknown placement policy {name!r}; choose one of {sorted(POLICIES)}") from None
