"""The scheduler's view of the cluster, kept up to date one change at a time.

Adapters feed it events (a node came, a workload was bound, a project's quota changed);
it keeps the aggregates a cycle needs (free capacity per GPU, usage per project and pool)
so that a ``decide`` cycle costs what the pending work costs, not what the running work
does. Only node changes rebuild the capacity arrays.

What it files per workload is made of strings and numbers only (``_filed``): CPython stops
tracking such tuples, so the cyclic garbage collector's full passes, whose pause grows with
every container object alive, do not walk the snapshot's own bookkeeping, and filing an
event leaves no container behind to bring the next full pass closer.
"""

from __future__ import annotations

import bisect
import itertools
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from .cluster import ClusterArrays
from .guarantee import evictable
from .model import (
    Department,
    Node,
    Project,
    State,
    ValidationError,
    Workload,
    check_seconds,
)
from .placement import PlacementPolicy, get_policy


@dataclass
class SchedulerConfig:
    policy: str = "gpupool"
    # Node label gangs try to share when a workload names none (e.g. "rack").
    default_topology_key: str | None = None
    reclaim: bool = True  # take back over-quota GPUs for projects under quota
    fair_share_reclaim: bool = True  # also for projects under their fair share
    preempt: bool = True  # higher priority displaces lower inside a project
    # Consolidate may also move another project's training inside its quota (restarted at
    # once on another node, where room is free for it now, keeping its GPUs) for a waiting
    # pod within its own project's fair share: a move keeps the guarantee (record 0050).
    # Off: work in its quota is never evicted for another project.
    consolidate_in_quota: bool = True
    # Candidates one workload's eviction plan may look at before it gives up for this cycle;
    # bounds a cycle's cost when little can be evicted.
    max_victim_scan: int = 128
    # A workload that restarted after a preemption may not be preempted or taken for fair
    # share again for this long (needs Snapshot.now and Workload.started_at); stops
    # preempt-resume-preempt thrash; not even reclaim for a project below its quota may
    # (it takes other work first, and this after the window: the trace replay measured
    # thrash where it could, and every in-quota wait within its bound where it cannot).
    resume_protection_s: float = 600.0
    # Fair share over time (quota.OverQuotaLedger, quota.may_catch_up): the half-life of a
    # project's over-quota lag, kept by the adapter (4 h: a working day's usage counts,
    # last week's does not); and how far apart, in seconds of the waiting workload's GPUs,
    # its lag and a victim's must lie before it may reclaim from a project ahead.
    fair_share_half_life_s: float = 14400.0
    catch_up_s: float = 600.0
    # Off: the adapters keep no lag, so the core sees every project even (an empty
    # Snapshot.over_quota_lag) and divides over-quota GPUs by the instant's fair share only.
    fair_share_over_time: bool = True

    def __post_init__(self) -> None:
        # Each bound with the field's name: a negative window or scan would not fail, it
        # would quietly change what the cycle may evict.
        if not (isinstance(self.max_victim_scan, int) and self.max_victim_scan >= 1):
            raise ValidationError("max_victim_scan", f"must be an integer >= 1, got {self.max_victim_scan!r}")
        check_seconds("resume_protection_s", self.resume_protection_s)
        check_seconds("catch_up_s", self.catch_up_s)
        check_seconds("fair_share_half_life_s", self.fair_share_half_life_s, positive=True)
        for name in ("fair_share_over_time", "consolidate_in_quota"):
            if not isinstance(getattr(self, name), bool):
                raise ValidationError(name, f"must be true or false, got {getattr(self, name)!r}")


@dataclass
class Snapshot:
    config: SchedulerConfig = field(default_factory=SchedulerConfig)
    now: float | None = None  # the adapter's clock; the core never reads one itself

    def __post_init__(self) -> None:
        self.nodes: dict[str, Node] = {}
        self.departments: dict[str, Department] = {}
        self.projects: dict[str, Project] = {}
        self.workloads: dict[str, Workload] = {}
        self.pending: dict[str, Workload] = {}
        # Workloads holding GPUs (running or releasing), per project.
        self.holding: dict[str, dict[str, Workload]] = defaultdict(dict)
        # The same workloads per node they have a pod on (node name -> names): what runs on
        # one node, without a pass over every workload.
        self.holding_on: dict[str, set[str]] = defaultdict(set)
        # Of them, those with more than one pod, and those that resumed after an eviction:
        # the few a move leaves where they are (actions.consolidate), without a pass over all.
        self.holding_gangs: set[str] = set()
        self.holding_resumed: set[str] = set()
        self.usage: dict[tuple[str, str], int] = defaultdict(int)  # (project, pool) -> milli
        # Of it, what work that cannot give way holds (Workload.gives_way): the in-quota test of
        # work that may not go over quota counts only this (quota.counted_usage).
        self.fixed_usage: dict[tuple[str, str], int] = defaultdict(int)
        # (project, pool) -> [CPU milli, memory MiB] its holding work takes (CPU/memory quotas).
        self.cpu_memory: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
        # Per project, its running preemptible work in eviction order (lowest priority, then
        # most recent first), kept sorted as work comes and goes.
        self.victims: dict[str, list[tuple[int, float, str]]] = defaultdict(list)
        # What each workload was filed under when it came, so that removing it undoes exactly
        # that even if the adapter changed the object in place since: (shape id, pods, project,
        # victim key or None, counted in fixed_usage, ((pool, milli held), ...), ((node, GPU
        # indices, milli per GPU), ...), CPU milli per pod, memory MiB per pod). Strings and
        # numbers only: see the module's docstring.
        self._filed: dict[str, tuple] = {}
        self.releasing: dict[str, Workload] = {}  # evicted, still holding GPUs until they exit
        # (project, pool) -> over-quota lag in milli-GPU-seconds, from the adapter's
        # quota.OverQuotaLedger; empty (everyone even) where an adapter keeps none.
        self.over_quota_lag: dict[tuple[str, str], float] = {}
        # Pods per (demand, GPU models) over all known work: the workload mix placement
        # policies measure fragmentation against, kept without a pass over every pod.
        self.shape_counts: dict[tuple, int] = defaultdict(int)
        # Each key of shape_counts by a number, so that a filed record names it in an int.
        self._shape_ids: dict[tuple, int] = {}
        self._shape_keys: dict[int, tuple] = {}
        self._next_shape_id = itertools.count()
        self._arrays: ClusterArrays | None = None
        # Per project, the milli-GPUs per GPU slot (rows and slots of ``arrays``) that its
        # ``victims`` hold: what reclaim could free at most (actions.victims.OverQuotaRoom),
        # kept with the arrays so that a cycle does not sum thousands of placements for it.
        self._victims_hold: dict[str, np.ndarray] = {}
        self._total_gpus = 0
        self._policy: tuple[str, PlacementPolicy] | None = None

    @classmethod
    def build(
        cls,
        nodes=(),
        departments=(),
        projects=(),
        workloads=(),
        config: SchedulerConfig | None = None,
    ) -> Snapshot:
        snap = cls(config or SchedulerConfig())
        for n in nodes:
            snap.add_node(n)
        for d in departments:
            snap.set_department(d)
        for p in projects:
            snap.set_project(p)
        for w in workloads:
            snap.upsert_workload(w)
        return snap

    # -- nodes ---------------------------------------------------------------------------
    def add_node(self, node: Node) -> None:
        node.validate()
        self.remove_node(node.name)
        self.nodes[node.name] = node
        self._total_gpus += len(node.gpus)
        self._arrays = None

    def remove_node(self, name: str) -> None:
        node = self.nodes.pop(name, None)
        if node is not None:
            self._total_gpus -= len(node.gpus)
            self._arrays = None

    @property
    def arrays(self) -> ClusterArrays:
        """Free capacity after every holding workload; rebuilt only after node changes."""
        if self._arrays is None:
            arrays = ClusterArrays.from_nodes(list(self.nodes.values()))
            self._victims_hold = {}
            for by_name in self.holding.values():
                for name in by_name:
                    self._apply(arrays, self._filed[name], take=True)
                    self._hold(arrays, self._filed[name], take=True)
            self._arrays = arrays
        return self._arrays

    def victim_pods(self, name: str) -> tuple[tuple[str, tuple[int, ...], int], ...]:
        """Where a running preemptible workload's pods are, as filed (node name, GPU
        indices, milli-GPUs on each): what ``victims_hold`` counts for it; () for any other."""
        filed = self._filed.get(name)
        return filed[6] if filed is not None and filed[3] is not None else ()

    def victims_hold(self, project: str) -> np.ndarray | None:
        """Milli-GPUs per GPU slot (rows and slots of ``arrays``) held by ``project``'s
        running preemptible work (its ``victims``); None where it holds none. Read-only."""
        _ = self.arrays
        return self._victims_hold.get(project)

    def placement_policy(self) -> PlacementPolicy:
        """The configured placement policy, kept across cycles: what it learnt (the
        workload mix, per-node score caches) stays valid from one cycle to the next."""
        if self._policy is None or self._policy[0] != self.config.policy:
            self._policy = (self.config.policy, get_policy(self.config.policy))
        return self._policy[1]

    def total_gpus(self) -> int:
        return self._total_gpus

    # -- organisation --------------------------------------------------------------------
    def set_department(self, dept: Department) -> None:
        for pool, q in dept.quotas.items():
            q.validate(f"department[{dept.name}].quotas[{pool}]")
        self.departments[dept.name] = dept

    def remove_department(self, name: str) -> None:
        if any(p.department == name for p in self.projects.values()):
            raise ValidationError(f"department[{name}]", "still has projects; remove them first")
        self.departments.pop(name, None)

    def set_project(self, project: Project) -> None:
        if project.department not in self.departments:
            raise ValidationError(
                f"project[{project.name}].department",
                f"department {project.department!r} does not exist",
            )
        for pool, q in project.quotas.items():
            q.validate(f"project[{project.name}].quotas[{pool}]")
        self.projects[project.name] = project

    def remove_project(self, name: str) -> None:
        self.projects.pop(name, None)

    # -- workloads -----------------------------------------------------------------------
    def upsert_workload(self, w: Workload) -> None:
        w.validate()
        total = self._total_gpus
        need = w.pods * w.demand.gpu_count
        if need > total and self.nodes:
            raise ValidationError(
                f"workload[{w.name}].pods",
                f"the gang needs {need} GPUs and the whole cluster has {total}",
            )
        name, state, project = w.name, w.state, w.project
        if state != State.PENDING:
            for p in w.placement:
                if p.node not in self.nodes:
                    raise ValidationError(f"workload[{w.name}].placement", f"unknown node {p.node!r}")
        if name in self.workloads:
            self.remove_workload(name)
        self.workloads[name] = w
        shape = (w.demand, w.gpu_models)
        shape_id = self._shape_ids.get(shape)
        if shape_id is None:
            shape_id = self._shape_ids[shape] = next(self._next_shape_id)
            self._shape_keys[shape_id] = shape
        self.shape_counts[shape] += w.pods
        if state == State.PENDING:
            self._filed[name] = (shape_id, w.pods, project, None, False, (), (), 0, 0)
            self.pending[name] = w
            return
        victim = victim_key(w) if state == State.RUNNING and evictable(w) else None
        fixed = not w.gives_way
        nodes = self.nodes
        held = tuple((nodes[p.node].pool, p.gpu_milli * len(p.gpu_indices)) for p in w.placement)
        pods_at = tuple((p.node, p.gpu_indices, p.gpu_milli) for p in w.placement)
        filed = (shape_id, w.pods, project, victim, fixed, held, pods_at, w.demand.cpu_milli, w.demand.memory_mib)
        self._filed[name] = filed
        self.holding[project][name] = w
        for node, _, _ in pods_at:
            self.holding_on[node].add(name)
        if w.pods > 1:
            self.holding_gangs.add(name)
        if w.resumed:
            self.holding_resumed.add(name)
        for pool, milli in held:
            self.usage[(project, pool)] += milli
            if fixed:
                self.fixed_usage[(project, pool)] += milli
            held_cpu_memory = self.cpu_memory[(project, pool)]
            held_cpu_memory[0] += w.demand.cpu_milli
            held_cpu_memory[1] += w.demand.memory_mib
        if victim is not None:
            bisect.insort(self.victims[project], victim)
        if state == State.RELEASING:
            self.releasing[name] = w
        if self._arrays is not None:
            self._apply(self._arrays, filed, take=True)
            self._hold(self._arrays, filed, take=True)

    def remove_workload(self, name: str) -> None:
        w = self.workloads.pop(name, None)
        if w is None:
            return
        filed = self._filed.pop(name)
        shape_id, pods, project, victim, fixed, held = filed[:6]
        shape = self._shape_keys[shape_id]
        left = self.shape_counts[shape] - pods
        if left:
            self.shape_counts[shape] = left
        else:
            del self.shape_counts[shape], self._shape_ids[shape], self._shape_keys[shape_id]
        if self.pending.pop(name, None) is not None:
            return
        self.holding[project].pop(name, None)
        for node, _, _ in filed[6]:
            self.holding_on[node].discard(name)
        self.holding_gangs.discard(name)
        self.holding_resumed.discard(name)
        self.releasing.pop(name, None)
        for pool, milli in held:
            self.usage[(project, pool)] -= milli
            if fixed:
                self.fixed_usage[(project, pool)] -= milli
            held_cpu_memory = self.cpu_memory[(project, pool)]
            held_cpu_memory[0] -= filed[7]
            held_cpu_memory[1] -= filed[8]
        if victim is not None:
            keys = self.victims[project]
            del keys[bisect.bisect_left(keys, victim)]
        if self._arrays is not None:
            self._apply(self._arrays, filed, take=False)
            self._hold(self._arrays, filed, take=False)

    @staticmethod
    def _apply(arrays: ClusterArrays, filed: tuple, take: bool) -> None:
        op = arrays.take if take else arrays.give
        pods_at, cpu, mem = filed[6:]
        for node, gpus, milli in pods_at:
            i = arrays.index.get(node)
            if i is not None:
                op(i, gpus, milli, cpu, mem)

    def _hold(self, arrays: ClusterArrays, filed: tuple, take: bool) -> None:
        """Count a victim's GPUs in (or out of) its project's ``victims_hold``."""
        project, victim, pods_at = filed[2], filed[3], filed[6]
        if victim is None:
            return
        sign = 1 if take else -1
        for node, gpus, milli in pods_at:
            i = arrays.index.get(node)
            if i is not None and gpus:
                held = self._victims_hold.get(project)
                if held is None:
                    held = self._victims_hold[project] = np.zeros(arrays.gpu_free.shape, dtype=np.int64)
                row = held[i]
                for g in gpus:
                    row[g] += sign * milli


def victim_key(w: Workload) -> tuple[int, float, str]:
    """Eviction order: lowest priority first, then the most recently submitted."""
    return (w.effective_priority, -w.submit_time, w.name)
