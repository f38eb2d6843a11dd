"""Whether the rules let a waiting pod start: the reading of "allocation while work waits"
(record 0051) that counts only the moments in which some waiting pod could start.

A pod *could start* when some node would hold it (its GPUs, CPUs and memory) with every
workload gone that the rules let go for it. What stays is *protected* work, by the rules'
own definition (``scheduler.guarantee.protection``):
  not preemptible      a workspace or an inference service inside its team's quota;
  own project          the pod's own project's work of its priority or higher (a project
                       preempts only its lower-priority work for its own);
  other project in quota  another project's work while that project holds no more than
                       its quota (the in-quota promise);
  resumed lately       work restarted after an eviction within the resume protection;
and work that is releasing is already gone. A pod that could not start is *held back*;
``hold_causes`` names what protects the work on the nodes big enough for it (or that no
node is).

The holdings are read once per scheduling cycle into per-node arrays, one per protection
and project, so that each waiting pod costs a few array sums, not a pass over the work.
"""

from __future__ import annotations

from collections import defaultdict
from typing import cast

import numpy as np

from ..guarantee import evictable, outranks, resumed_lately
from ..model import MILLI, State, Workload
from ..snapshot import Snapshot

__all__ = ["CAUSES", "Holdings"]

CAUSES = ("not preemptible", "own project", "other project in quota", "no node big enough", "resumed lately")


class Holdings:
    """What the running work holds on each node after one cycle, by what protects it."""

    def __init__(self, snap: Snapshot, held: dict[str, int], quota: dict[str, int]):
        nodes = list(snap.nodes.values())
        self.index = {n.name: i for i, n in enumerate(nodes)}
        width = max((len(n.gpus) for n in nodes), default=0)
        self.gpu_mem = np.zeros((len(nodes), width), dtype=np.int64)
        self.has_gpu = np.zeros((len(nodes), width), dtype=bool)
        for i, n in enumerate(nodes):
            for g in n.gpus:
                self.gpu_mem[i, g.index] = g.memory_mib
                self.has_gpu[i, g.index] = True
        self.cpu = np.array([n.cpu_milli for n in nodes], dtype=np.int64)
        self.mem = np.array([n.memory_mib for n in nodes], dtype=np.int64)
        self.over = {p: held.get(p, 0) > q for p, q in quota.items()}
        shape = (len(nodes), width)
        # Per key: (GPU milli per node and GPU, CPU per node, memory per node). Keys:
        # "fixed" (not evictable), "resumed" (resumed lately), and (project, priority) for
        # the rest.
        self.parts: dict[object, tuple[np.ndarray, np.ndarray, np.ndarray]] = defaultdict(
            lambda: (np.zeros(shape, dtype=np.int64), np.zeros(len(nodes), dtype=np.int64),
                     np.zeros(len(nodes), dtype=np.int64)))
        for ws in snap.holding.values():
            for v in ws.values():
                if v.state != State.RUNNING:
                    continue
                key: object = (v.project, v.effective_priority)
                if resumed_lately(v, snap.now, snap.config.resume_protection_s):
                    key = "resumed"
                elif not evictable(v):
                    key = "fixed"
                gpu, cpu, mem = self.parts[key]
                for p in v.placement:
                    i = self.index[p.node]
                    for gi in p.gpu_indices:
                        gpu[i, gi] += p.gpu_milli
                    cpu[i] += v.demand.cpu_milli
                    mem[i] += v.demand.memory_mib
        self._sum: dict[tuple, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}

    def _kept(self, keys: list) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        key = tuple(sorted(map(str, keys)))
        if key not in self._sum:
            parts = [self.parts[k] for k in keys if k in self.parts]
            gpu, cpu, mem = (np.zeros_like(self.gpu_mem), np.zeros_like(self.cpu),
                             np.zeros_like(self.mem))
            for pg, pc, pm in parts:
                gpu, cpu, mem = gpu + pg, cpu + pc, mem + pm
            self._sum[key] = (gpu, cpu, mem)
        return self._sum[key]

    def _keys(self, w: Workload) -> dict[str, list]:
        """The parts that stay for ``w``, by protection."""
        own, other = [], []
        for k in self.parts:
            if k in ("fixed", "resumed"):
                continue
            project, prio = cast(tuple[str, int], k)
            if project == w.project:
                if outranks(prio, w):
                    own.append(k)
            elif not self.over.get(project, False):
                other.append(k)
        return {CAUSES[0]: ["fixed"], CAUSES[1]: own, CAUSES[2]: other, CAUSES[4]: ["resumed"]}

    def _room(self, w: Workload, kept: tuple[np.ndarray, np.ndarray, np.ndarray]) -> np.ndarray:
        """Per node: would it hold ``w`` beside ``kept``?"""
        d = w.demand
        gpu, cpu, mem = kept
        if d.gpus:
            need = np.full_like(self.gpu_mem, MILLI)
        elif d.gpu_fraction:
            need = np.full_like(self.gpu_mem, round(d.gpu_fraction * MILLI))
        else:
            need = np.minimum(MILLI, -(-d.gpu_memory_mib * MILLI // np.maximum(self.gpu_mem, 1)))
        gpus_ok = ((gpu + need <= MILLI) & self.has_gpu).sum(axis=1) >= max(1, d.gpus)
        return gpus_ok & (self.cpu - cpu >= d.cpu_milli) & (self.mem - mem >= d.memory_mib)

    def fits_free(self, w: Workload) -> bool:
        """Would some node hold ``w`` in its free room, every running workload staying?"""
        return bool(self._room(w, self._kept(list(self.parts))).any())

    def could_start(self, w: Workload) -> bool:
        keys = self._keys(w)
        return bool(self._room(w, self._kept([k for ks in keys.values() for k in ks])).any())

    def hold_causes(self, w: Workload) -> set[str]:
        """What protects the work on the nodes big enough for ``w``: the protections whose
        work is there (``CAUSES``), or that no node is big enough."""
        nothing = (np.zeros_like(self.gpu_mem), np.zeros_like(self.cpu), np.zeros_like(self.mem))
        big = self._room(w, nothing)
        if not big.any():
            return {CAUSES[3]}
        out = set()
        for cause, keys in self._keys(w).items():
            gpu, cpu, _ = self._kept(keys)
            if (gpu[big].sum() + cpu[big].sum()) > 0:
                out.add(cause)
        return out
