"""What one scheduling cycle's actions share (KAI-Scheduler's Session): the snapshot, the
cycle's working copy, the fair shares, the decisions so far, and the questions every action
asks of them (which pools, what the quota rule says, where a gang goes).

Nothing here changes anything outside the cycle: placements go into the working copy and
the decisions; the actions (``scheduler.actions``) decide what to ask.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Iterator

import numpy as np

from .cluster import ClusterArrays
from .model import Bind, Decisions, PodPlacement, Project, Quota, Workload
from .placement import Choice
from .quota import (
    IN_QUOTA,
    Verdict,
    admit,
    department_quota,
    fair_shares,
    in_quota,
    resource_reason,
)
from .snapshot import Snapshot
from .working import Working


def queue_order(w: Workload) -> tuple:
    """Higher priority first (a resumed workload one step up), then first come, first
    served; the name breaks ties."""
    return (-w.queue_priority, w.submit_time, w.name)


def describe_demand(w: Workload) -> str:
    d = w.demand
    if d.gpus:
        gpu = f"{d.gpus} GPU{'s' if d.gpus > 1 else ''}"
    elif d.gpu_fraction:
        gpu = f"{d.gpu_fraction:g} GPU"
    elif d.gpu_memory_mib:
        gpu = f"{d.gpu_memory_mib / 1024:g} GiB of GPU memory"
    else:
        gpu = f"{d.cpu_milli / 1000:g} CPU and {d.memory_mib / 1024:g} GiB memory"
    return gpu if w.pods == 1 else f"{w.pods} pods x {gpu}"


def pod_size(w: Workload) -> tuple[int, int, int, int] | None:
    """What one pod of ``w`` needs, comparable part by part (GPUs, milli per GPU, CPU,
    memory); None where sizes do not order answers: gangs (placed pod by pod, and a greedy
    order need not fail monotonically) and GPU-memory requests (milli depends on the GPU)."""
    d = w.demand
    if w.pods != 1 or d.gpu_memory_mib:
        return None
    return (d.gpu_count, d.milli_on(1), d.cpu_milli, d.memory_mib)


class TooBig:
    """Pod sizes known to get a "no" in the cycle's current state, per group of otherwise
    equal questions: a pod at least as big in every part gets the same "no" (room and
    quota only shrink as a pod grows). Only the smallest such sizes are kept."""

    def __init__(self) -> None:
        self.sizes: dict[tuple, list[tuple[int, int, int, int]]] = {}

    def covers(self, group: tuple, size: tuple | None) -> bool:
        if size is None:
            return False
        g, m, c, mem = size  # asked for every single pod placed: written out
        for s in self.sizes.get(group, ()):
            if g >= s[0] and m >= s[1] and c >= s[2] and mem >= s[3]:
                return True
        return False

    def add(self, group: tuple, size: tuple | None) -> None:
        if size is not None:
            known = self.sizes.setdefault(group, [])
            known[:] = [s for s in known if not all(a >= b for a, b in zip(s, size))]
            known.append(size)

    def clear(self) -> None:
        self.sizes.clear()


class Cycle:
    def __init__(self, snap: Snapshot):
        t0 = time.perf_counter()
        self.snap = snap
        self.cfg = snap.config
        self.work = Working(snap)
        self.policy = snap.placement_policy()
        self.order = sorted(snap.pending.values(), key=queue_order)
        if hasattr(self.policy, "prepare_counts"):
            self.policy.prepare_counts(snap.shape_counts)
        self.dept_projects: dict[str, list[Project]] = defaultdict(list)
        for p in snap.projects.values():
            self.dept_projects[p.department].append(p)
        self.pools = self.work.arrays.pools
        self.dept_quotas: dict[tuple[str, str], Quota] = {}
        # Per (project, pool): what a quota verdict reads besides usage (see verdict).
        self.quota_rules: dict[tuple[str, str], tuple] = {}
        self.cpu_memory_caps: dict[tuple[str, str], tuple | None] = {}
        self.capacity_reasons: dict[tuple, tuple[str, str]] = {}
        self.project_pools: dict[str, list[str]] = {}
        a = self.work.arrays
        self.pool_gpu_mem = {
            pool: int(a.gpu_mem[a.pool_id == i].max()) for i, pool in enumerate(self.pools) if (a.pool_id == i).any()
        }
        self.milli_cache: dict[tuple[str, str], int] = {}
        self.fair = self._fair_shares()
        self.decisions = Decisions()
        for (project, pool), milli in sorted(self.fair.items()):
            self.decisions.fair_share_milli[(project, pool)] = milli
        # The pending work whose project and pool exist, in queue order (``actions.allocate.KnownWork``).
        self.waiting: list[Workload] = []
        self.placed: set[str] = set()
        self.why: dict[str, str | tuple[str, str]] = {}
        self.failed: dict[tuple, int] = {}  # (pool, shape id) -> epoch it failed at
        self.shape_ids: dict[tuple, int] = {}  # what placement looks at -> shape id
        self.shape_of: dict[str, tuple] = {}  # workload -> _shape(w)
        # Single pods that found no room since capacity last grew, per pool and GPU models.
        self.no_room, self.no_room_epoch = TooBig(), 0
        self.reserved: set[str] = set()  # placed behind evictions; bound in a later cycle
        self.decisions.timings["snapshot_s"] = time.perf_counter() - t0

    def _fair_shares(self) -> dict[tuple[str, str], int]:
        demand: dict[str, dict[str, float]] = {pool: defaultdict(float) for pool in self.pools}
        for (project, pool), milli in self.snap.usage.items():
            if pool in demand:
                demand[pool][project] += milli
        for w in self.order:
            pools = self.pools_for(w)
            if pools and w.project in self.snap.projects:
                demand[pools[0]][w.project] += self.milli(w, pools[0])
        out = {}
        for pool in self.pools:
            shares = fair_shares(
                self.work.arrays.capacity_milli(pool),
                self.snap.departments,
                self.snap.projects,
                demand[pool],
                pool,
            )
            out.update({(p, pool): s for p, s in shares.items()})
        return out

    # -- what the actions ask ---------------------------------------------------------
    def pools_for(self, w: Workload) -> list[str]:
        if w.node_pool is not None:
            return [w.node_pool] if w.node_pool in self.pools else []
        pools = self.project_pools.get(w.project)
        if pools is None:  # the project's pools, most quota first
            project = self.snap.projects.get(w.project)
            quota = (lambda pool: project.quotas.get(pool, Quota()).gpus) if project else (lambda pool: 0)
            pools = self.project_pools[w.project] = sorted(self.pools, key=lambda pool: (-quota(pool), pool))
        return pools

    def milli(self, w: Workload, pool: str) -> int:
        """The gang's GPU need in ``pool``; memory requests count on its largest GPUs."""
        key = (w.name, pool)
        milli = self.milli_cache.get(key)
        if milli is None:
            milli = self.milli_cache[key] = w.gpu_milli_estimate(self.pool_gpu_mem.get(pool, 1))
        return milli

    def _dept_quota(self, dept: str, pool: str) -> Quota:
        key = (dept, pool)
        if key not in self.dept_quotas:
            self.dept_quotas[key] = department_quota(self.snap.departments[dept], self.dept_projects[dept], pool)
        return self.dept_quotas[key]

    def verdict(self, w: Workload, pool: str, freed: int = 0) -> Verdict:
        """The quota rule's answer for ``w``, as things are or with ``freed`` milli-GPU of
        its own project's work gone; first its project's and department's CPU and memory
        quotas, which bind every kind of work alike."""
        caps = self.cpu_memory_caps.get((w.project, pool), ())
        if caps == ():
            caps = self.cpu_memory_caps[(w.project, pool)] = self._cpu_memory_caps(w.project, pool)
        if caps is not None:
            why = self.cpu_memory_reason(w, pool, caps)
            if why:
                return Verdict(False, False, why)
        return self._gpu_verdict(w, pool, freed)

    def _cpu_memory_caps(self, project: str, pool: str) -> tuple | None:
        """(project quota, department quota) where either sets a CPU or memory quota."""
        p = self.snap.projects[project]
        d = self.snap.departments.get(p.department)
        pq, dq = p.quotas.get(pool), d.quotas.get(pool) if d is not None else None
        if not any(q is not None and (q.cpu is not None or q.memory_gib is not None) for q in (pq, dq)):
            return None
        return pq, dq

    def cpu_memory_reason(self, w: Workload, pool: str, caps: tuple) -> str:
        pq, dq = caps
        cpu, mem = w.pods * w.demand.cpu_milli, w.pods * w.demand.memory_mib
        dept = self.work.dept_of.get(w.project, "")
        return (resource_reason(f"project {w.project}", pq, self.work.cpu_memory[(w.project, pool)], cpu, mem)
                or resource_reason(f"department {dept}", dq, self.work.dept_cpu_memory[(dept, pool)], cpu, mem))

    def _gpu_verdict(self, w: Workload, pool: str, freed: int = 0) -> Verdict:
        rule = self.quota_rules.get((w.project, pool))
        if rule is None:
            project = self.snap.projects[w.project]
            dept_quota = self._dept_quota(project.department, pool)
            key, dept = (w.project, pool), (self.work.dept_of.get(w.project, ""), pool)
            rule = self.quota_rules[key] = (
                project, dept_quota, key, dept, project.quotas.get(pool, Quota()).quota_milli, dept_quota.quota_milli
            )
        project, dept_quota, key, dept, quota, dept_in_quota_max = rule
        milli = self.milli_cache.get((w.name, pool))  # milli(), its common case written out
        if milli is None:
            milli = self.milli(w, pool)
        work, over_ok = self.work, w.may_go_over_quota
        if not freed:
            used, dept_in_quota = work.usage[key], work.dept_in_quota[dept]
            fixed = used if over_ok else work.fixed_usage[key]  # what quota.admit counts
            # The common question, answered here when it is "in quota" and every GPU counts.
            if fixed == used and in_quota(quota, dept_in_quota_max, milli, used, dept_in_quota):
                return IN_QUOTA
            return admit(
                project, dept_quota, pool, w.kind, over_ok, milli, used, dept_in_quota, work.dept_usage[dept],
                None if over_ok else fixed,
            )
        return admit(
            project, dept_quota, pool, w.kind, over_ok, milli, *work.usage_after(w.project, pool, -freed),
            None if over_ok else work.fixed_usage[key],
        )

    def fits_fair_share(self, w: Workload, pool: str) -> bool:
        return self.work.usage[(w.project, pool)] + self.milli(w, pool) <= self.fair.get((w.project, pool), 0)

    def lag(self, project: str, pool: str) -> float:
        """Over-quota GPU-seconds the project got above (> 0) or below its share lately."""
        return self.snap.over_quota_lag.get((project, pool), 0.0)

    def place(self, w: Workload, pool: str, protected: bool = False) -> list[Choice] | None:
        """Place the whole gang in ``pool`` (taking its capacity), or nothing. ``protected``
        work (placed in quota, or not preemptible: what reclaim for another project may not
        take) goes to the pool's scarce nodes (``ClusterArrays.scarce``) only where no other
        node can take it, so what runs there stays reclaimable for the pods only they hold.
        A gang is kept off them whole, or placed as if they were like any other node."""
        shape = self.shape_of.get(w.name)
        if shape is None:  # worked out once per workload and cycle
            shape = self.shape_of[w.name] = self._shape(w)
        sid, size, topo = shape
        key, group = (pool, sid), (pool, w.gpu_models, w.constraints)
        epoch = self.work.epoch
        if self.failed.get(key) == epoch:
            return None
        if self.no_room_epoch != epoch:  # capacity grew: what found no room may now
            self.no_room.clear()
            self.no_room_epoch = epoch
        elif self.no_room.covers(group, size):
            return None
        a = self.work.arrays
        # Off the scarce nodes first, then anywhere (the one rule for pods and gangs alike).
        tries = (True, False) if protected and w.demand.gpu_count and a.has_scarce(pool) else (False,)
        if w.pods == 1 and topo is None:  # the common case: nothing to undo
            for off_scarce in tries:
                c = self._place_pod(a, a.eligible_view(pool, w.gpu_models, w.demand, off_scarce, w.constraints), w)
                if c is not None:
                    self.work.take(w, [c])
                    return [c]
            self.failed[key] = epoch
            self.no_room.add(group, size)
            return None
        for off_scarce in tries:
            for domain in self._domains(topo, pool):
                with self.work.trial() as gang:  # a gang is placed whole or not at all
                    choices: list[Choice] = []
                    for _ in range(w.pods):
                        if domain is None:  # the kept mask, as for a single pod
                            mask = a.eligible_view(pool, w.gpu_models, w.demand, off_scarce, w.constraints)
                        else:
                            mask = a.eligible(pool, w.gpu_models, w.demand, w.constraints) & domain
                            if off_scarce:
                                mask &= ~a.scarce(pool)
                        c = self._place_pod(a, mask, w)
                        if c is None:
                            break
                        self.work.take(w, [c])
                        choices.append(c)
                    if len(choices) == w.pods:
                        gang.keep()
                        return choices
        self.failed[key] = self.work.epoch
        self.no_room.add(group, size)
        return None

    def _place_pod(self, a: ClusterArrays, mask: np.ndarray, w: Workload) -> Choice | None:
        """One pod of ``w`` on a node of ``mask``. With preferred node affinity the policy
        chooses among the best-scored nodes that have room: the nodes of the highest score
        first, then of the next one, and so on (decision 0075)."""
        pref = a.preference(w.constraints)
        if pref is None:
            return self.policy.place(a, mask, w.demand)
        for level in np.unique(pref[mask])[::-1]:
            c = self.policy.place(a, mask & (pref == level), w.demand)
            if c is not None:
                return c
        return None

    def _shape(self, w: Workload) -> tuple[int, tuple | None, str | None]:
        """(a number for everything placement looks at, its pod size, its topology key)."""
        placement = (w.gpu_models, w.demand, w.pods, w.topology_key, w.constraints)
        sid = self.shape_ids.setdefault(placement, len(self.shape_ids))
        return sid, pod_size(w), w.topology_key or (self.cfg.default_topology_key if w.pods > 1 else None)

    def _domains(self, key: str | None, pool: str) -> Iterator[np.ndarray | None]:
        """Topology domains to try for a gang, fullest first, then the whole pool."""
        a = self.work.arrays
        if key:
            values = sorted({lab[key] for lab in a.labels if key in lab})
            masks = [np.array([lab.get(key) == v for lab in a.labels]) for v in values]
            masks.sort(key=lambda m: int(a.full_free[m].sum()))
            yield from masks
        yield None

    def bind(self, w: Workload, choices: list[Choice], over_quota: bool) -> None:
        names = self.work.arrays.names
        pods = tuple(PodPlacement(names[c.node], c.gpus, c.milli) for c in choices)
        self.decisions.binds.append(Bind(w.name, pods, over_quota))
        self.placed.add(w.name)

    def try_place(self, w: Workload, allow: Callable[[str, Verdict], bool]) -> bool:
        """Place ``w`` in the first pool whose verdict ``allow`` accepts and that has room;
        otherwise remember why it failed in its first pool."""
        why: str | tuple[str, str] | None = None
        for pool in self.pools_for(w):
            v = self.verdict(w, pool)
            if not allow(pool, v):
                why = why or v.reason
                continue
            choices = self.place(w, pool, protected=not (v.over_quota and w.is_preemptible))
            if choices is not None:
                self.bind(w, choices, v.over_quota)
                return True
            why = why or self.capacity_reason(w, pool)
        if why:
            self.why[w.name] = why
        return False

    def capacity_reason(self, w: Workload, pool: str) -> tuple[str, str]:
        anywhere = self.work.arrays.any_eligible(pool, w.gpu_models, w.demand, w.constraints)
        key = (pool, w.gpu_models, w.demand, w.pods, anywhere, w.constraints)
        reason = self.capacity_reasons.get(key)
        if reason is None:  # the same few texts for thousands of workloads: made once each
            where = f"pool {pool}" + (f" with GPU model {'/'.join(w.gpu_models)}" if w.gpu_models else "")
            if not anywhere:
                what = f"{w.demand.cpu_milli / 1000:g} CPU and {w.demand.memory_mib / 1024:g} GiB memory"
            else:
                what = describe_demand(w) if w.pods == 1 else f"room for the whole gang of {describe_demand(w)}"
            reason = self.capacity_reasons[key] = (where, what)
        return reason
