"""Whether the rules let a waiting pod start: the reading of "allocation while work waits"
(records 0051, 0083) that counts only the moments in which some waiting pod could start.

A pod *could start* when some node would hold it (its GPUs, CPUs and memory) with the
work gone that the rules would take for it. What stays is *protected* work, by the rules'
own definition (``scheduler.guarantee.protection``):
  not preemptible      a workspace or an inference service inside its team's quota;
  own project          the pod's own project's work of its priority or higher (a project
                       preempts only its lower-priority work for its own);
  other project in quota  another project's work while that project holds no more than
                       its quota (the in-quota promise); of a project over its quota, what
                       the reclaim rule leaves it (``actions.evictions.may_take``);
  other project's fair share  for a pod over its own quota, another project's work that
                       neither fair-share reclaim nor catch up would take for it
                       (``takeable_from``);
  resumed lately       work restarted after an eviction within the resume protection;
  reclaim in flight    work already evicted and releasing its GPUs: the rules took that
                       room, and the pod waits for it whatever they decide now;
and a pod that could not start is *held back*; ``hold_causes`` names what protects the work
on the nodes big enough for it (or that no node is).

The holdings are read once per scheduling cycle into per-node arrays, one per protection
and project, so that each waiting pod costs a few array sums; only where that bound finds
room does the reading weigh, node by node, which sets of a project's work the reclaim
rule lets one plan take (``room_on``).
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from collections.abc import Iterable
from typing import cast

import numpy as np

from ..actions.evictions import Floor, may_take
from ..guarantee import evictable, outranks, resumed_lately
from ..model import DEFAULT_POOL, MILLI, Node, PodDemand, State, Workload
from ..quota import may_catch_up
from ..snapshot import SchedulerConfig, Snapshot

__all__ = ["CAUSES", "Holdings", "room_on", "takeable_from"]

CAUSES = ("not preemptible", "own project", "other project in quota", "no node big enough", "resumed lately",
          "reclaim in flight", "other project's fair share")

# Past this many pieces of one project, or sets of pieces, on one node the reading stops
# weighing and counts room: it stays an upper bound on what the rules allow, never below.
MOST_PIECES, MOST_SETS = 12, 4096


def takeable_from(w: Workload, milli: int, held: dict[str, int], quota: dict[str, int], fair: dict[str, int],
                  lag: dict[tuple[str, str], float], cfg: SchedulerConfig) -> dict[str, Floor]:
    """The other projects whose work the rules may take for waiting ``w`` (``milli`` its
    GPUs), each with the floor it keeps (``actions.evictions``): for a pod inside its
    project's quota, every project over its quota (quota reclaim, down to the quota and
    below it as ``may_take`` allows); for one over its quota, a project above its fair
    share while ``w`` fits its own (fair-share reclaim), or ahead of its share over time
    while ``w``'s project is behind (catch up, down to the quota). ``fair`` is the cycle's
    fair share per project, ``lag`` the over-quota lag per (project, pool)."""
    mine = held.get(w.project, 0)
    if mine + milli <= quota.get(w.project, 0):
        if not cfg.reclaim:
            return {}
        return {p: Floor(q, below=True) for p, q in quota.items() if p != w.project and held.get(p, 0) > q}
    out: dict[str, Floor] = {}
    if not cfg.fair_share_reclaim:
        return out
    fits_fair = mine + milli <= fair.get(w.project, 0)
    my_lag = lag.get((w.project, DEFAULT_POOL), 0.0)
    for p, q in quota.items():
        if p == w.project or held.get(p, 0) <= q:
            continue
        floors = []
        if fits_fair and held[p] > fair.get(p, 0):
            floors.append(fair.get(p, 0))
        if may_catch_up(my_lag, lag.get((p, DEFAULT_POOL), 0.0), milli, cfg.catch_up_s, mine, fair.get(w.project, 0)):
            floors.append(q)
        if floors:
            out[p] = Floor(min(floors))
    return out


def room_on(node: Node, demand: PodDemand, stays: Iterable[Workload], others: dict[str, list[Workload]],
            floors: dict[str, Floor], held: dict[str, int]) -> bool:
    """Would ``node`` hold a pod of ``demand`` with ``stays`` kept and, of each project in
    ``others`` (its unprotected work there), a set that the reclaim rule lets one plan take
    (``may_take`` with the project's floor, counting the whole of each piece) gone?"""
    kept = list(stays)
    sets = []
    for project, pieces in others.items():
        if len(pieces) > MOST_PIECES:
            return True  # too many to weigh: counted as room (the bound)
        floor = floors[project]
        allowed: list[tuple[Workload, ...]] = []
        for k in range(len(pieces) + 1):
            for chosen in itertools.combinations(pieces, k):
                milli = [v.allocated_milli() for v in chosen]
                if not chosen or may_take(floor, held.get(project, 0) - sum(milli), min(milli)):
                    allowed.append(chosen)
            if len(allowed) > MOST_SETS:
                return True
        sets.append((pieces, allowed))
    if math.prod(len(a) for _, a in sets) > MOST_SETS:
        return True
    for combo in itertools.product(*(a for _, a in sets)):
        gone = {v.name for chosen in combo for v in chosen}
        gpu: dict[int, int] = defaultdict(int)
        cpu = mem = 0
        for v in itertools.chain(kept, (v for pieces, _ in sets for v in pieces if v.name not in gone)):
            for p in v.placement:
                if p.node == node.name:
                    for g in p.gpu_indices:
                        gpu[g] += p.gpu_milli
                    cpu += v.demand.cpu_milli
                    mem += v.demand.memory_mib
        if holds(node, demand, gpu, cpu, mem):
            return True
    return False


def holds(node: Node, d: PodDemand, kept_gpu: dict[int, int] | None = None, cpu: int = 0, mem: int = 0) -> bool:
    """Could ``node`` hold a pod of demand ``d`` beside what is kept there (milli per GPU
    index, CPU and memory)? With nothing kept: is the node big enough for it at all."""
    if node.cpu_milli - cpu < d.cpu_milli or node.memory_mib - mem < d.memory_mib:
        return False
    kept_gpu = kept_gpu or {}
    room = sum(1 for g in node.gpus if kept_gpu.get(g.index, 0) + d.milli_on(g.memory_mib) <= MILLI)
    return room >= max(1, d.gpus)


class Holdings:
    """What the running and releasing work holds on each node after one cycle, by what
    protects it. ``fair``: the cycle's fair share per project (milli), which the rules read
    for work over its quota."""

    def __init__(self, snap: Snapshot, held: dict[str, int], quota: dict[str, int], fair: dict[str, int] | None = None):
        self.snap, self.held, self.quota, self.fair = snap, held, quota, fair or {}
        nodes = list(snap.nodes.values())
        self.nodes = nodes
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
        # "fixed" (not evictable), "resumed" (resumed lately), "releasing", and
        # (project, priority) for the rest.
        self.parts: dict[object, tuple[np.ndarray, np.ndarray, np.ndarray]] = defaultdict(
            lambda: (np.zeros(shape, dtype=np.int64), np.zeros(len(nodes), dtype=np.int64),
                     np.zeros(len(nodes), dtype=np.int64)))
        for ws in snap.holding.values():
            for v in ws.values():
                key = self._key(v)
                if key is None:
                    continue
                gpu, cpu, mem = self.parts[key]
                for p in v.placement:
                    i = self.index[p.node]
                    for gi in p.gpu_indices:
                        gpu[i, gi] += p.gpu_milli
                    cpu[i] += v.demand.cpu_milli
                    mem[i] += v.demand.memory_mib
        self._on: dict[int, list[tuple[Workload, object]]] | None = None  # node -> its work, for ``room_on``
        self._sum: dict[tuple, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        # Answers per (project, priority, demand, GPUs): pods of one shape and project share them.
        self._answers: dict[tuple, object] = {}

    def _key(self, v: Workload) -> object:
        """Which part ``v`` is held in; None for work that holds nothing."""
        if v.state == State.RELEASING:
            return "releasing"
        if v.state != State.RUNNING:
            return None
        if resumed_lately(v, self.snap.now, self.snap.config.resume_protection_s):
            return "resumed"
        if not evictable(v):
            return "fixed"
        return (v.project, v.effective_priority)

    def _work_on(self, i: int) -> list[tuple[Workload, object]]:
        """Node ``i``'s work with its part, read once per cycle where a set must be weighed."""
        if self._on is None:
            self._on = defaultdict(list)
            for ws in self.snap.holding.values():
                for v in ws.values():
                    key = self._key(v)
                    if key is not None:
                        for n in {self.index[p.node] for p in v.placement}:
                            self._on[n].append((v, key))
        return self._on.get(i, [])

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

    def milli(self, w: Workload) -> int:
        return w.gpu_milli_estimate(int(self.gpu_mem.max()) if self.gpu_mem.size else 1)

    def takeable(self, w: Workload, milli: int | None = None) -> dict[str, Floor]:
        """Of the other projects, those whose work the rules may take for ``w``, with floors."""
        m = self.milli(w) if milli is None else milli
        return takeable_from(w, m, self.held, self.quota, self.fair, self.snap.over_quota_lag, self.snap.config)

    def _keys(self, w: Workload, takeable: dict[str, Floor]) -> dict[str, list]:
        """The parts that stay for ``w``, by protection."""
        own: list[object] = []
        other: list[object] = []
        share: list[object] = []
        preempt = self.snap.config.preempt
        for k in self.parts:
            if k in ("fixed", "resumed", "releasing"):
                continue
            project, prio = cast(tuple[str, int], k)
            if project == w.project:
                if outranks(prio, w) or not preempt:
                    own.append(k)
            elif project not in takeable:
                (share if self.over.get(project, False) else other).append(k)
        return {CAUSES[0]: ["fixed"], CAUSES[1]: own, CAUSES[2]: other, CAUSES[4]: ["resumed"],
                CAUSES[5]: ["releasing"], CAUSES[6]: share}

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

    def could_start(self, w: Workload, milli: int | None = None) -> bool:
        """Would some node hold ``w`` with the work gone that the rules would take for it
        (``milli``: its GPUs as the quota counts them; read from ``w`` if not given)?"""
        m = self.milli(w) if milli is None else milli
        key = ("start", w.project, w.effective_priority, w.demand, m)
        if key not in self._answers:
            self._answers[key] = self._could_start(w, m)
        return bool(self._answers[key])

    def _could_start(self, w: Workload, milli: int) -> bool:
        takeable = self.takeable(w, milli)
        keys = self._keys(w, takeable)
        bound = self._room(w, self._kept([k for ks in keys.values() for k in ks]))
        if not bound.any():
            return False
        # The bound took every piece of the projects it may take from; the reclaim rule
        # takes only sets that leave each its floor: weigh those where the bound found room.
        for i in np.flatnonzero(bound):
            stays, others = [], defaultdict(list)
            for v, key in self._work_on(int(i)):
                if isinstance(key, tuple) and key[0] in takeable:
                    others[v.project].append(v)
                elif not (isinstance(key, tuple) and key[0] == w.project and not outranks(key[1], w)
                          and self.snap.config.preempt):
                    stays.append(v)
            if not others or room_on(self.nodes[i], w.demand, stays, others, takeable, self.held):
                return True
        return False

    def hold_causes(self, w: Workload, milli: int | None = None) -> set[str]:
        """What protects the work on the nodes big enough for ``w``: the protections whose
        work is there (``CAUSES``), or that no node is big enough. Work of a project the
        rules may take from that is there too counts as what its floor protects."""
        m = self.milli(w) if milli is None else milli
        key = ("causes", w.project, w.effective_priority, w.demand, m)
        if key not in self._answers:
            self._answers[key] = self._hold_causes(w, m)
        return set(cast(set, self._answers[key]))

    def _hold_causes(self, w: Workload, m: int) -> set[str]:
        nothing = (np.zeros_like(self.gpu_mem), np.zeros_like(self.cpu), np.zeros_like(self.mem))
        big = self._room(w, nothing)
        if not big.any():
            return {CAUSES[3]}
        takeable = self.takeable(w, m)
        keys = self._keys(w, takeable)
        floor_cause = CAUSES[2] if self.held.get(w.project, 0) + m <= self.quota.get(w.project, 0) else CAUSES[6]
        keys[floor_cause] = keys[floor_cause] + [k for k in self.parts if isinstance(k, tuple) and k[0] in takeable]
        out = set()
        for cause, ks in keys.items():
            gpu, cpu, _ = self._kept(ks)
            if (gpu[big].sum() + cpu[big].sum()) > 0:
                out.add(cause)
        return out
