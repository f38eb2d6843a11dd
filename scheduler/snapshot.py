"""The scheduler's view of the cluster, kept up to date one change at a time.

Adapters feed it events (a node came, a workload was bound, a project's quota changed);
it keeps the aggregates a cycle needs (free capacity per GPU, usage per project and pool)
so that a ``decide`` cycle costs what the pending work costs, not what the running work
does. Only node changes rebuild the capacity arrays.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from dataclasses import dataclass, field

from .cluster import ClusterArrays
from .model import (
    Department,
    Node,
    PodDemand,
    PodPlacement,
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
        if not isinstance(self.fair_share_over_time, bool):
            raise ValidationError("fair_share_over_time", f"must be true or false, got {self.fair_share_over_time!r}")


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
        self.usage: dict[tuple[str, str], int] = defaultdict(int)  # (project, pool) -> milli
        # Of it, what work that cannot give way holds (Workload.gives_way): the in-quota test of
        # work that may not go over quota counts only this (quota.counted_usage).
        self.fixed_usage: dict[tuple[str, str], int] = defaultdict(int)
        # workload -> (counted in fixed_usage, [(pool, milli)])
        self._held: dict[str, tuple[bool, list[tuple[str, int]]]] = {}
        # Per project, its running preemptible work in eviction order (lowest priority, then
        # most recent first), kept sorted as work comes and goes.
        self.victims: dict[str, list[tuple[int, float, str]]] = defaultdict(list)
        # What each workload was filed under when it came, so that removing it undoes exactly
        # that even if the adapter changed the object in place since.
        self._filed: dict[str, tuple[tuple[PodDemand, tuple[str, ...], int, str, tuple[PodPlacement, ...]],
                                     tuple[int, float, str] | None]] = {}
        self.releasing: dict[str, Workload] = {}  # evicted, still holding GPUs until they exit
        # (project, pool) -> over-quota lag in milli-GPU-seconds, from the adapter's
        # quota.OverQuotaLedger; empty (everyone even) where an adapter keeps none.
        self.over_quota_lag: dict[tuple[str, str], float] = {}
        # Pods per (demand, GPU models) over all known work: the workload mix placement
        # policies measure fragmentation against, kept without a pass over every pod.
        self.shape_counts: dict[tuple, int] = defaultdict(int)
        self._arrays: ClusterArrays | None = None
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
            for by_name in self.holding.values():
                for w in by_name.values():
                    self._apply(arrays, w.placement, w.demand, take=True)
            self._arrays = arrays
        return self._arrays

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
        name, state = w.name, w.state
        if name in self.workloads:
            self.remove_workload(name)
        self.workloads[name] = w
        self.shape_counts[(w.demand, w.gpu_models)] += w.pods
        victim = victim_key(w) if state == State.RUNNING and w.is_preemptible else None
        self._filed[name] = ((w.demand, w.gpu_models, w.pods, w.project, w.placement), victim)
        if state == State.PENDING:
            self.pending[name] = w
            return
        for p in w.placement:
            if p.node not in self.nodes:
                raise ValidationError(f"workload[{w.name}].placement", f"unknown node {p.node!r}")
        self.holding[w.project][w.name] = w
        held = [(self.nodes[p.node].pool, p.gpu_milli * len(p.gpu_indices)) for p in w.placement]
        fixed = not w.gives_way
        self._held[name] = (fixed, held)
        for pool, milli in held:
            self.usage[(w.project, pool)] += milli
            if fixed:
                self.fixed_usage[(w.project, pool)] += milli
        if victim is not None:
            bisect.insort(self.victims[w.project], victim)
        if w.state == State.RELEASING:
            self.releasing[w.name] = w
        if self._arrays is not None:
            self._apply(self._arrays, w.placement, w.demand, take=True)

    def remove_workload(self, name: str) -> None:
        w = self.workloads.pop(name, None)
        if w is None:
            return
        (demand, models, pods, project, placement), victim = self._filed.pop(name)
        self.shape_counts[(demand, models)] -= pods
        if not self.shape_counts[(demand, models)]:
            del self.shape_counts[(demand, models)]
        if self.pending.pop(name, None) is not None:
            return
        self.holding[project].pop(name, None)
        self.releasing.pop(name, None)
        fixed, held = self._held.pop(name)
        for pool, milli in held:
            self.usage[(project, pool)] -= milli
            if fixed:
                self.fixed_usage[(project, pool)] -= milli
        if victim is not None:
            keys = self.victims[project]
            del keys[bisect.bisect_left(keys, victim)]
        if self._arrays is not None:
            self._apply(self._arrays, placement, demand, take=False)

    def _apply(self, arrays: ClusterArrays, placement, demand, take: bool) -> None:
        op = arrays.take if take else arrays.give
        for p in placement:
            i = arrays.index.get(p.node)
            if i is not None:
                op(i, p.gpu_indices, p.gpu_milli, demand.cpu_milli, demand.memory_mib)


def victim_key(w: Workload) -> tuple[int, float, str]:
    """Eviction order: lowest priority first, then the most recently submitted."""
    return (w.effective_priority, -w.submit_time, w.name)
