"""Node capacity as dense arrays, so placement looks at every node in one vector step.

Rows are nodes, columns are GPU slots. A slot a node does not have holds -1 free, so no
request ever fits there. Arrays are only ever changed through ``take``/``give`` so the
derived columns (``full_free``) stay true.

Every ``take``/``give`` also stamps the node it changed with a number from a clock shared by
an array set and all its copies (``Lineage``), so a stamp names one node state exactly:
placement policies key per-node caches on ``stamp`` and recompute only the rows whose stamp
moved (see ``scheduler/placement/score_cache.py``).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numpy as np

from .constraints import NO_CONSTRAINTS, NodeConstraints, Taint, unavailable
from .model import MILLI, Node, PodDemand

CHANGE_LOG_MAX = 1 << 16
# Changed nodes up to which eligible() updates a kept mask row by row (else it recomputes).
MASK_ROWS_BY_HAND = 64
MASK_ROWS_IN_PYTHON = 8  # up to this many, row by row in Python; past it, one numpy step
MASKS_KEPT = 256


class Lineage:
    """Shared by an array set and its copies: the stamp clock and policies' per-node caches."""

    __slots__ = ("clock", "caches", "static", "could_hold", "__weakref__")

    def __init__(self) -> None:
        self.clock = itertools.count(1)
        self.caches: dict = {}
        self.static: dict = {}  # eligibility masks that depend only on node attributes
        self.could_hold: dict = {}  # per pod shape too (``ClusterArrays.could_hold``): bounded


@dataclass
class ClusterArrays:
    names: list[str]
    index: dict[str, int]
    pools: list[str]
    models: list[str]
    labels: list[dict[str, str]]
    taints: list[tuple[Taint, ...]]
    pool_id: np.ndarray  # (N,) int16
    model_id: np.ndarray  # (N,) int16; model of the node's GPUs (-1: no GPU)
    gpu_count: np.ndarray  # (N,) int16
    gpu_mem: np.ndarray  # (N, G) int32 MiB per GPU slot, 1 where there is none
    gpu_free: np.ndarray  # (N, G) int32 milli-GPU free per slot, -1 where there is none
    full_free: np.ndarray  # (N,) int16 GPUs with nothing on them
    cpu_free: np.ndarray  # (N,) int64 milli-CPU
    mem_free: np.ndarray  # (N,) int64 MiB
    cpu_total: np.ndarray = field(default=None)  # type: ignore[arg-type]  # (N,) int64 milli-CPU of the node
    mem_total: np.ndarray = field(default=None)  # type: ignore[arg-type]  # (N,) int64 MiB of the node
    # (N,) int64: clock value of the node's last take/give (0: as built); equal stamps within
    # one lineage mean equal node state.
    stamp: np.ndarray = field(default=None)  # type: ignore[arg-type]
    lineage: Lineage = field(default=None)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        # Nodes changed through this object, in order (a copy starts a log of its own): lets
        # a cache that saw the log up to some point find the rows changed since.
        self.changed: list[int] = []
        # eligible()'s masks, kept in step with ``changed``: key -> [mask, log, seen, static,
        # rows]: ``mask`` is a read-only view of ``rows``, which only ``_eligible`` writes (so
        # an update costs no flag toggling, ~1 us each, asked thousands of times a cycle).
        self._masks: dict[tuple, list] = {}
        # The same entries by id() of their mask, for kept_in_step (asked once per placement).
        # Only masks held in _masks are here, so an id cannot name an array since freed.
        self._kept: dict[int, list] = {}
        if self.stamp is None:
            self.stamp = np.zeros(len(self.names), dtype=np.int64)
        if self.lineage is None:
            self.lineage = Lineage()

    @classmethod
    def from_nodes(cls, nodes: list[Node]) -> ClusterArrays:
        n = len(nodes)
        g = max((len(x.gpus) for x in nodes), default=0) or 1
        pools = sorted({x.pool for x in nodes})
        models = sorted({gpu.model for x in nodes for gpu in x.gpus})
        pool_ix = {p: i for i, p in enumerate(pools)}
        model_ix = {m: i for i, m in enumerate(models)}
        gpu_free = np.full((n, g), -1, dtype=np.int32)
        gpu_mem = np.ones((n, g), dtype=np.int32)
        model_id = np.full(n, -1, dtype=np.int16)
        for i, node in enumerate(nodes):
            for gpu in node.gpus:
                gpu_free[i, gpu.index] = MILLI
                gpu_mem[i, gpu.index] = gpu.memory_mib
            if node.gpus:
                model_id[i] = model_ix[node.gpus[0].model]
        return cls(
            names=[x.name for x in nodes],
            index={x.name: i for i, x in enumerate(nodes)},
            pools=pools,
            models=models,
            labels=[dict(x.labels) for x in nodes],
            taints=[x.taints for x in nodes],
            pool_id=np.array([pool_ix[x.pool] for x in nodes], dtype=np.int16),
            model_id=model_id,
            gpu_count=np.array([len(x.gpus) for x in nodes], dtype=np.int16),
            gpu_mem=gpu_mem,
            gpu_free=gpu_free,
            full_free=np.array([len(x.gpus) for x in nodes], dtype=np.int16),
            cpu_free=np.array([x.cpu_milli for x in nodes], dtype=np.int64),
            mem_free=np.array([x.memory_mib for x in nodes], dtype=np.int64),
            cpu_total=np.array([x.cpu_milli for x in nodes], dtype=np.int64),
            mem_total=np.array([x.memory_mib for x in nodes], dtype=np.int64),
        )

    def copy(self) -> ClusterArrays:
        """A copy whose capacity columns can change without touching this one."""
        return ClusterArrays(
            names=self.names,
            index=self.index,
            pools=self.pools,
            models=self.models,
            labels=self.labels,
            taints=self.taints,
            pool_id=self.pool_id,
            model_id=self.model_id,
            gpu_count=self.gpu_count,
            gpu_mem=self.gpu_mem,
            gpu_free=self.gpu_free.copy(),
            full_free=self.full_free.copy(),
            cpu_free=self.cpu_free.copy(),
            mem_free=self.mem_free.copy(),
            cpu_total=self.cpu_total,
            mem_total=self.mem_total,
            stamp=self.stamp.copy(),
            lineage=self.lineage,
        )

    def take(self, node: int, gpus: tuple[int, ...], milli: int, cpu: int, mem: int) -> None:
        row = self.gpu_free[node]  # a view: one lookup per pod, not per slot
        for j in gpus:
            if row[j] == MILLI:
                self.full_free[node] -= 1
            row[j] -= milli
        self.cpu_free[node] -= cpu
        self.mem_free[node] -= mem
        self.stamp[node] = next(self.lineage.clock)
        self._log_change(node)

    def give(self, node: int, gpus: tuple[int, ...], milli: int, cpu: int, mem: int) -> None:
        row = self.gpu_free[node]
        for j in gpus:
            row[j] += milli
            if row[j] == MILLI:
                self.full_free[node] += 1
        self.cpu_free[node] += cpu
        self.mem_free[node] += mem
        self.stamp[node] = next(self.lineage.clock)
        self._log_change(node)

    def _log_change(self, node: int) -> None:
        # A long-lived array set (the snapshot's, fed for days) starts a fresh log now and
        # then; a cache that followed the old one then compares every stamp once.
        if len(self.changed) >= CHANGE_LOG_MAX:
            self.changed = []
        self.changed.append(node)

    def eligible(self, pool: str | None, models: tuple[str, ...], demand: PodDemand,
                 constraints: NodeConstraints | None = None) -> np.ndarray:
        """Nodes whose pool, GPU model, CPU and memory allow one pod of ``demand``, and whose
        labels and taints its ``constraints`` allow (a fresh array the caller may change).

        The mask is kept per question and brought up to date from the change log: a cycle
        asks the same few questions thousands of times with a node or two changed between."""
        return self._eligible(pool, models, demand, constraints=constraints).copy()

    def eligible_view(self, pool: str | None, models: tuple[str, ...], demand: PodDemand,
                      off_scarce: bool = False, constraints: NodeConstraints | None = None) -> np.ndarray:
        """``eligible``'s mask as kept, read-only, without a copy: valid until the next
        take/give. A placement policy may keep results for it (``kept_in_step``).
        ``off_scarce``: without the pool's ``scarce`` nodes."""
        return self._eligible(pool, models, demand, off_scarce, constraints)

    def kept_in_step(self, mask: np.ndarray) -> bool:
        """Whether ``mask`` is a kept ``eligible_view`` mask, up to date with ``changed``:
        from here on it changes only at nodes appended to ``changed``, and only when it is
        asked for again (a mask rebuilt is a new array)."""
        entry = self._kept.get(id(mask))
        if entry is None or entry[0] is not mask:
            return False
        return entry[1] is self.changed and entry[2] == len(self.changed)

    def any_eligible(self, pool: str | None, models: tuple[str, ...], demand: PodDemand,
                     constraints: NodeConstraints | None = None) -> bool:
        """Whether any node's pool, GPU model, CPU and memory allow one pod of ``demand``."""
        return bool(self._eligible(pool, models, demand, constraints=constraints).any())

    def _eligible(self, pool: str | None, models: tuple[str, ...], demand: PodDemand,
                  off_scarce: bool = False, constraints: NodeConstraints | None = None) -> np.ndarray:
        """The kept mask for ``eligible``, up to date (not to be changed by the caller)."""
        cpu, mem = demand.cpu_milli, demand.memory_mib
        key = (pool, models, demand.gpu_count, cpu, mem, off_scarce, constraints)
        entry = self._masks.get(key)
        log = self.changed
        if entry is None or entry[1] is not log or len(log) - entry[2] > MASK_ROWS_BY_HAND:
            static = self._static(pool, models, demand.gpu_count, off_scarce, constraints)
            rows = static & (self.cpu_free >= cpu) & (self.mem_free >= mem)
            mask = rows.view()
            mask.flags.writeable = False  # changed only here, through ``rows``, in step with the log
            if len(self._masks) >= MASKS_KEPT:  # a long-lived array set asked many questions
                self._masks.clear()
                self._kept.clear()
            elif entry is not None:
                del self._kept[id(entry[0])]
            self._masks[key] = self._kept[id(mask)] = [mask, log, len(log), static, rows]
            return mask
        mask, _, seen, static, rows = entry
        if seen < len(log):
            cpu_free, mem_free = self.cpu_free, self.mem_free
            changed = set(log[seen:])  # a node changed twice is looked at once
            if len(changed) > MASK_ROWS_IN_PYTHON:
                idx = np.fromiter(changed, dtype=np.int64, count=len(changed))
                rows[idx] = static[idx] & (cpu_free[idx] >= cpu) & (mem_free[idx] >= mem)
            else:
                for node in changed:
                    rows[node] = static[node] and cpu_free[node] >= cpu and mem_free[node] >= mem
            entry[2] = len(log)
        return mask

    def could_hold(self, pool: str | None, models: tuple[str, ...], demand: PodDemand,
                   constraints: NodeConstraints | None = None) -> np.ndarray:
        """Nodes that could take one pod of ``demand`` if nothing ran on them (read-only).
        Totals never change within a lineage, so the mask is kept there per pod shape."""
        kept = self.lineage.could_hold
        key = (pool, models, demand.gpu_count, demand.cpu_milli, demand.memory_mib, constraints)
        out = kept.get(key)
        if out is None:
            static = self._static(pool, models, demand.gpu_count, constraints=constraints)
            out = static & (self.cpu_total >= demand.cpu_milli) & (self.mem_total >= demand.memory_mib)
            out.flags.writeable = False
            if len(kept) >= MASKS_KEPT:  # a long-lived lineage sees many pod shapes
                kept.clear()
            kept[key] = out
        return out

    def scarce(self, pool: str | None) -> np.ndarray:
        """Nodes of ``pool`` that alone can hold its biggest pods: those of the biggest node
        shape (the most GPUs, and of those the most CPUs and the most memory), when the pool
        has other GPU nodes (else none): a pod asking for more GPUs, CPUs or memory than the
        others have can only go there. Kept per lineage, as ``_static``."""
        key = ("scarce", pool)
        out = self.lineage.static.get(key)
        if out is None:
            inside = self._static(pool, (), 0) & (self.gpu_count > 0)
            out = np.zeros(len(self.names), dtype=bool)
            if inside.any():
                most = inside & (self.gpu_count == self.gpu_count[inside].max())
                top = most & (self.cpu_total == self.cpu_total[most].max()) & (self.mem_total == self.mem_total[most].max())
                if top.sum() < inside.sum():
                    out = top
            self.lineage.static[key] = out
        return out

    def has_scarce(self, pool: str | None) -> bool:
        """Whether ``pool`` has ``scarce`` nodes (asked at every placement; kept as ``scarce``)."""
        key = ("has scarce", pool)
        out = self.lineage.static.get(key)
        if out is None:
            out = self.lineage.static[key] = bool(self.scarce(pool).any())
        return out

    def allowed(self, constraints: NodeConstraints | None) -> np.ndarray | None:
        """Nodes whose labels, name and taints ``constraints`` allow; None: every node (no
        constraints, no tainted node). Kept per lineage and distinct constraints, so
        thousands of pods with the same ones cost one pass over the nodes."""
        key = ("allowed", constraints)
        st = self.lineage.static
        if key not in st:
            if constraints is None and not any(self.taints):
                st[key] = None
            else:
                c = constraints or NO_CONSTRAINTS
                rows = zip(self.names, self.labels, self.taints)
                st[key] = np.fromiter((c.allows(*r) for r in rows), dtype=bool, count=len(self.names))
        return st[key]

    def preference(self, constraints: NodeConstraints | None) -> np.ndarray | None:
        """Each node's preferred-affinity score for ``constraints`` (``NodeConstraints.
        preference``); None when they prefer nothing. Kept per lineage like ``allowed``."""
        if constraints is None or not constraints.preferred:
            return None
        key = ("preference", constraints)
        st = self.lineage.static
        if key not in st:
            rows = zip(self.names, self.labels)
            st[key] = np.fromiter((constraints.preference(*r) for r in rows), dtype=np.int64,
                                  count=len(self.names))
        return st[key]

    def unavailable(self, constraints: NodeConstraints | None) -> str | None:
        """When no node at all allows ``constraints``: kube-scheduler's sentence saying why
        ("0/4 nodes are available: ..."); else None."""
        ok = self.allowed(constraints)
        if ok is None or ok.any():
            return None
        return unavailable(constraints or NO_CONSTRAINTS, list(zip(self.names, self.labels, self.taints)))

    def _static(self, pool: str | None, models: tuple[str, ...], gpu_count: int,
                off_scarce: bool = False, constraints: NodeConstraints | None = None) -> np.ndarray:
        """Nodes whose pool, GPU model, GPU count and the pod's constraints allow it
        (``off_scarce``: less the pool's scarce nodes); these never change within a lineage,
        so the mask is kept there."""
        if off_scarce:
            key_off = ("off_scarce", pool, models, gpu_count, constraints)
            static = self.lineage.static.get(key_off)
            if static is None:
                static = self._static(pool, models, gpu_count, constraints=constraints) & ~self.scarce(pool)
                self.lineage.static[key_off] = static
            return static
        key = (pool, models, gpu_count, constraints)
        static = self.lineage.static.get(key)
        if static is None:
            static = np.ones(len(self.names), dtype=bool)
            if pool is not None:
                static &= self.pool_id == (self.pools.index(pool) if pool in self.pools else -1)
            if models:
                ids = [self.models.index(m) for m in models if m in self.models]
                static &= np.isin(self.model_id, ids)
            if gpu_count:
                static &= self.gpu_count >= gpu_count
            allowed = self.allowed(constraints)
            if allowed is not None:
                static &= allowed
            self.lineage.static[key] = static
        return static

    def need_milli(self, demand: PodDemand) -> np.ndarray | int:
        """Milli-GPUs the pod needs per GPU: a number, or per slot for memory requests."""
        if demand.gpu_memory_mib:
            return np.minimum(MILLI, -(-demand.gpu_memory_mib * MILLI // self.gpu_mem))
        return demand.milli_on(1)

    def capacity_milli(self, pool: str | None = None) -> int:
        counts = self.gpu_count if pool is None else self.gpu_count[self.pool_id == self.pools.index(pool)]
        return int(counts.sum()) * MILLI
