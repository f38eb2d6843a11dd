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
        # Per pod of the work gone: node, its workload's position, CPU, memory; per GPU slot
        # it holds: node, slot, milli. One pass (make-room builds these of a thousand victims).
        pod_node: list[int] = []
        pod_of: list[int] = []
        cpu: list[int] = []
        mem: list[int] = []
        slot_node: list[int] = []
        slot: list[int] = []
        milli: list[int] = []
        for i, (v, choices) in enumerate(gone):
            d = v.demand
            for c in choices:
                node, gpus = c.node, c.gpus
                pod_node.append(node)
                pod_of.append(i)
                cpu.append(d.cpu_milli)
                mem.append(d.memory_mib)
                if gpus:
                    k = len(gpus)
                    slot_node += [node] * k
                    slot += gpus
                    milli += [c.milli] * k
        width = arrays.gpu_free.shape[1]
        self.pod_node = np.array(pod_node, dtype=np.int64)
        self.pod_of = np.array(pod_of, dtype=np.int64)
        self.nodes = _unique(self.pod_node)
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


def give_back(gpus: np.ndarray | list[int], node: int, choices: list[Choice]) -> int:
    """Add to ``gpus`` (milli free per GPU slot of ``node``) what ``choices`` hold there, as
    if that work were gone; the number of its pods there (for their CPU and memory)."""
    pods = 0
    for c in choices:
        if c.node == node:
            pods += 1
            for j in c.gpus:
                gpus[j] += c.milli
    return pods


def _sums(at: np.ndarray, values: list[int], n: int) -> np.ndarray:
    """``values`` summed per position ``at`` into ``n`` integers."""
    if not values:
        return np.zeros(n, dtype=np.int64)
    return np.bincount(at, np.array(values, dtype=np.int64), minlength=n).astype(np.int64)


def _unique(a: np.ndarray) -> np.ndarray:
    """``np.unique`` of a 1-D integer array, without its per-call check for masked arrays
    (which imports ``numpy.ma`` on first use: 20 ms in a scheduler's first cycle)."""
    s = np.sort(a)
    if len(s) < 2:
        return s
    keep = np.empty(len(s), dtype=bool)
    keep[0] = True
    np.not_equal(s[1:], s[:-1], out=keep[1:])
    return s[keep]
