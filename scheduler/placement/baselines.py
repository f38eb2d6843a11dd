"""The FGD paper's baselines (ATC'23, "Beware of Fragmentation"), weakest first: random
fit, tight packing, BestFit and FGD itself."""

from __future__ import annotations

import numpy as np

from ..cluster import ClusterArrays
from ..model import MILLI, PodDemand
from .choice import NEG, Choice, TieOrder, best_slot, choice_at, fits
from .frag_policy import FragPolicy

# BestFit's normalisers (the FGD simulator's "max spec" of one node): 128 CPUs, 8 GPUs.
MAX_SPEC_CPU = 128_000
MAX_SPEC_GPU = 8 * MILLI


class RandomFit:
    """Any node that fits, uniformly at random (seeded); the paper's lower baseline."""

    name = "random"

    def __init__(self, seed: int | None = None):
        self.rng = np.random.default_rng(0 if seed is None else seed)

    def place(self, arrays: ClusterArrays, mask: np.ndarray, demand: PodDemand) -> Choice | None:
        ok = np.flatnonzero(fits(arrays, mask, demand))
        if not len(ok):
            return None
        node = int(ok[self.rng.integers(len(ok))])
        if demand.is_fractional:
            need = arrays.need_milli(demand)
            nd = need if isinstance(need, int) else need[node]
            slots = np.flatnonzero(arrays.gpu_free[node] >= nd)
            return choice_at(arrays, node, int(slots[self.rng.integers(len(slots))]), demand)
        return choice_at(arrays, node, 0, demand)



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
            milli = int(need if isinstance(need, int) else need[node, slot])
            return Choice(node, (slot,), milli)
        if not mask.any():
            return None
        score = np.where(mask, arrays.cpu_free + (arrays.gpu_count > 0) * (1 << 40), np.iinfo(np.int64).max)
        return Choice(int(np.argmin(score)), (), 0)

class BestFit:
    """The FGD paper's BestFit: least free CPU and GPU left after the pod, each normalised by
    a full node (128 CPUs, 8 GPUs) and weighted 1/2, as an integer score 0-100; ties:
    ``TieOrder``. Fractions go on the fitting GPU with least room, whole GPUs on the first free."""

    name = "bestfit"

    def __init__(self, seed: int | None = None):
        self.ties = TieOrder(seed)

    def place(self, arrays: ClusterArrays, mask: np.ndarray, demand: PodDemand) -> Choice | None:
        ok = fits(arrays, mask, demand)
        gpu_left = np.maximum(arrays.gpu_free, 0).sum(axis=1)
        req_gpu = demand.gpus * MILLI if demand.gpus else (int(np.max(arrays.need_milli(demand))) if demand.is_fractional else 0)
        rest = 0.5 * (arrays.cpu_free - demand.cpu_milli) / MAX_SPEC_CPU + 0.5 * (gpu_left - req_gpu) / MAX_SPEC_GPU
        score = np.where(ok, np.floor((1.0 - rest) * 100.0), NEG)
        node = self.ties.pick(score)
        if node is None:
            return None
        return choice_at(arrays, node, best_slot(arrays, node, demand) if demand.is_fractional else 0, demand)



class FGD(FragPolicy):
    """The FGD paper's policy as its simulator scores it: per node the GPU whose use grows
    fragmentation least, node score ``int(100 * sigmoid(delta / 1000))``; ties: ``TieOrder``."""

    name = "fgd"

    def _reduce(self, arrays, rows, delta, demand):
        x = np.clip(delta, -50_000.0, 50_000.0) / 1000.0
        score = np.where(delta > NEG / 2, np.floor(100.0 / (1.0 + np.exp(-x))), NEG)
        slot = np.argmax(score, axis=1)  # first of equal scores, as the simulator
        return score[np.arange(len(rows)), slot], slot
