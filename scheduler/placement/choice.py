"""What every placement policy shares: the ``Choice`` it returns, the score that means "does
not fit", how ties between equal nodes are broken, and the plain fit tests."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..cluster import ClusterArrays
from ..model import MILLI, PodDemand

NEG = -1e18  # a node's score where the pod does not fit


@dataclass(frozen=True)
class Choice:
    """Where one pod goes: the node, its GPU slots, the milli-GPUs per slot."""

    node: int
    gpus: tuple[int, ...]
    milli: int  # per GPU


class TieOrder:
    """How a policy breaks ties between equally scored nodes.

    Unseeded (the scheduler): the lowest node index. Seeded (the simulator): the first node
    in a node order shuffled once with the seed. That is what the FGD paper's simulator does
    (it numbers the nodes in a random order and its scheduler fork keeps the first best
    node); with it our BestFit and FGD land within 0.1 point of the published figures, with
    a fresh random pick at every tie they lose about 6 points (FGD) because consistent ties
    pack work onto the same nodes and random ones spread it.
    """

    def __init__(self, seed: int | None):
        self.seed = seed
        self.rank: np.ndarray | None = None

    def pick(self, score: np.ndarray) -> int | None:
        best = int(np.argmax(score))
        top = score[best]
        if top <= NEG / 2:
            return None
        if self.seed is None:
            return best
        if self.rank is None or len(self.rank) != len(score):
            self.rank = np.random.default_rng(self.seed).permutation(len(score))
        ties = np.flatnonzero(score == top)
        return int(ties[np.argmin(self.rank[ties])]) if len(ties) > 1 else best


def choice_at(arrays: ClusterArrays, node: int, slot: int, demand: PodDemand) -> Choice:
    # One node's row, in Python: numpy calls on 8 slots cost more than the work.
    if demand.gpus:
        free = [j for j, x in enumerate(arrays.gpu_free[node].tolist()) if x == MILLI]
        return Choice(node, tuple(free[: demand.gpus]), MILLI)
    if demand.gpu_memory_mib:
        need = arrays.need_milli(demand)
        return Choice(node, (slot,), need if isinstance(need, int) else int(need[node, slot]))
    if demand.is_fractional:
        return Choice(node, (slot,), demand.milli_on(1))
    return Choice(node, (), 0)


def fits(arrays: ClusterArrays, mask: np.ndarray, demand: PodDemand) -> np.ndarray:
    """Nodes in ``mask`` whose GPUs can hold the pod."""
    if demand.gpus:
        return mask & (arrays.full_free >= demand.gpus)
    if demand.is_fractional:
        need = arrays.need_milli(demand)
        return mask & (arrays.gpu_free >= need).any(axis=1)
    return mask


def best_slot(arrays: ClusterArrays, node: int, demand: PodDemand) -> int:
    """The GPU with least room that still fits a fraction (first of equals)."""
    need = arrays.need_milli(demand)
    row = arrays.gpu_free[node]
    nd = need if isinstance(need, int) else need[node]
    left = np.where(row >= nd, row - nd, MILLI + 1)
    return int(np.argmin(left))
