"""Room per node were some running work gone, as arrays: make-room asks it of whole
candidate lists at once (which nodes could fit a pod with every candidate gone), so the
question costs a few vector steps instead of a Python pass per node."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from ..cluster import ClusterArrays
from ..model import MILLI, Workload
from ..placement import Choice


class RoomWithout:
    """The nodes ``gone`` (work with its placements) holds, ascending (``nodes``), and on
    each its free GPU milli per slot, CPU and memory as they would be with that work gone.
    Taken from ``arrays`` as they are when made."""

    def __init__(self, arrays: ClusterArrays, gone: Iterable[tuple[Workload, list[Choice]]]):
        self.arrays = arrays
        # Per pod of the work gone: its placement, its workload's position, its demand.
        pods = [(c, i, v.demand) for i, (v, choices) in enumerate(gone) for c in choices]
        pod_node = [c.node for c, _, _ in pods]
        pod_of = [i for _, i, _ in pods]
        cpu = [d.cpu_milli for _, _, d in pods]
        mem = [d.memory_mib for _, _, d in pods]
        # Per GPU slot it holds: node, slot, milli.
        slot_node = [c.node for c, _, _ in pods for _ in c.gpus]
        slot = [j for c, _, _ in pods for j in c.gpus]
        milli = [c.milli for c, _, _ in pods for _ in c.gpus]
        width = arrays.gpu_free.shape[1]
        self.pod_node = np.array(pod_node, dtype=np.int64)
        self.pod_of = np.array(pod_of, dtype=np.int64)
        self.nodes = np.unique(self.pod_node)
        k = len(self.nodes)
        at = np.searchsorted(self.nodes, self.pod_node)
        self.cpu = arrays.cpu_free[self.nodes] + _sums(at, cpu, k)
        self.mem = arrays.mem_free[self.nodes] + _sums(at, mem, k)
        where = np.searchsorted(self.nodes, np.array(slot_node, dtype=np.int64)) * width + np.array(slot, dtype=np.int64)
        self.gpu = arrays.gpu_free[self.nodes].astype(np.int64) + _sums(where, milli, k * width).reshape(k, width)

    def fits(self, w: Workload) -> np.ndarray:
        """Per node of ``nodes``: would one pod of ``w`` fit there (CPU, memory, GPUs)? Pool,
        model and GPU count are the caller's to check (``Victims.fits_room``, per node)."""
        d = w.demand
        ok = (self.cpu >= d.cpu_milli) & (self.mem >= d.memory_mib)
        if d.gpus:
            ok &= (self.gpu == MILLI).sum(axis=1) >= d.gpus
        elif d.is_fractional:
            need = self.arrays.need_milli(d)
            ok &= (self.gpu >= (need if isinstance(need, int) else need[self.nodes])).any(axis=1)
        return ok

    def gone_on(self, node: int) -> list[int]:
        """Positions (in ``gone``'s order) of the work with a pod on ``node``."""
        return list(dict.fromkeys(self.pod_of[self.pod_node == node].tolist()))


def _sums(at: np.ndarray, values: list[int], n: int) -> np.ndarray:
    """``values`` summed per position ``at`` into ``n`` integers."""
    if not values:
        return np.zeros(n, dtype=np.int64)
    return np.bincount(at, np.array(values, dtype=np.int64), minlength=n).astype(np.int64)
