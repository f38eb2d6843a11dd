"""``decide(snapshot) -> Decisions``: one pure, deterministic scheduling cycle.

The cycle reads top to bottom:
  0. working copy   copy free capacity and usage; compute fair shares per pool
  1. in quota       place work that fits its project's (and department's) quota
  2. fair share     place over-quota work, least-served project (by weight) first,
                    as far as each project's fair share of the idle GPUs goes
  3. idle leftovers let over-quota work use GPUs nobody else asked for (up to limits),
                    the project furthest behind its share over time first
  4. make room      for work still waiting: reclaim over-quota GPUs for projects below
                    quota, then for projects below fair share (now, or over time:
                    Snapshot.over_quota_lag, quota.may_catch_up), then preempt lower
                    priority work of the same project; fewest evictions that make room
  5. reasons        every workload left waiting says why, with its queue position
Every step works on the cycle's copy inside checkpoints; nothing outside changes.
"""

from __future__ import annotations

import gc
import heapq
import itertools
import time
from collections import defaultdict
from collections.abc import Callable, Iterator

import numpy as np

from .model import (
    MILLI,
    NO_QUOTA,
    Bind,
    Decisions,
    Evict,
    Pending,
    PodDemand,
    PodPlacement,
    Project,
    Quota,
    State,
    Workload,
)
from .placement import Choice
from .quota import IN_QUOTA, admit, department_quota, fair_shares, in_quota, may_catch_up
from .snapshot import Snapshot
from .working import Working

__all__ = ["decide", "Floor", "may_take"]


class Floor(int):
    """What a victim's project keeps under one eviction strategy, in milli-GPUs: its quota
    (quota reclaim, catch up) or its fair share (fair-share reclaim). ``below`` marks the
    floor of quota reclaim's second pass, which ``may_take`` lets a project go below."""

    below: bool

    def __new__(cls, milli: int, below: bool = False) -> Floor:
        f = super().__new__(cls, milli)
        f.below = below
        return f


def may_take(floor: Floor | None, left: int, smallest: int) -> bool:
    """The reclaim rule, in one place: may a victim's project be left with ``left``
    milli-GPUs once the work taken from it by one plan (the smallest piece ``smallest``
    milli) is gone?

    At or above its floor, always. Below it only with a ``below`` floor (a project under
    its quota that reclaim without going below found no room for), and only when every
    piece taken would be over quota if it came back (``left + smallest > floor``): it
    cannot reclaim its way back in, so nothing thrashes, and a project that borrowed a gang
    or a multi-GPU pod cannot keep it against a team below its quota just because the
    piece is indivisible. Example: nlp (quota 1) holds a 0.25 workspace and a 2-GPU gang
    over quota; taking the gang leaves 0.25, and 0.25 + 2 > 1, so vision, below its quota,
    may take it; a 0.5 pod that 0.25 + 0.5 <= 1 would let back in may not be taken so."""
    if floor is None or left >= floor:
        return True
    return floor.below and left + smallest > floor


def decide(snapshot: Snapshot) -> Decisions:
    # The cyclic garbage collector waits until the cycle ends: a full pass walks every object
    # the snapshot holds (~0.4 s at 140,000 running pods), and where one fell inside a cycle
    # its time grew with the running pods, not the pending work. A cycle makes no garbage
    # that needs it (reference counting frees what it drops).
    paused = gc.isenabled()
    if paused:
        gc.disable()
    try:
        return _Cycle(snapshot).run()
    finally:
        if paused:
            gc.enable()


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


class _TooBig:
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


class _Cycle:
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
        # Per (project, pool): what a quota verdict reads besides usage (see _verdict).
        self.quota_rules: dict[tuple[str, str], tuple] = {}
        self.capacity_reasons: dict[tuple, tuple[str, str]] = {}
        self.project_pools: dict[str, list[str]] = {}
        a = self.work.arrays
        self.pool_gpu_mem = {
            pool: int(a.gpu_mem[a.pool_id == i].max()) for i, pool in enumerate(self.pools) if (a.pool_id == i).any()
        }
        self.milli_cache: dict[tuple[str, str], int] = {}
        self.pool_of_workload: dict[str, str | None] = {}
        self.fair = self._fair_shares()
        self.decisions = Decisions()
        for (project, pool), milli in sorted(self.fair.items()):
            self.decisions.fair_share_milli[(project, pool)] = milli
        self.placed: set[str] = set()
        self.why: dict[str, str | tuple[str, str]] = {}
        self.failed: dict[tuple, int] = {}  # (pool, shape id) -> epoch it failed at
        self.shape_ids: dict[tuple, int] = {}  # what placement looks at -> shape id
        self.shape_of: dict[str, tuple] = {}  # workload -> _shape(w)
        # Single pods that found no room since capacity last grew, per pool and GPU models.
        self.no_room, self.no_room_epoch = _TooBig(), 0
        # In make-room, since the last plan that evicted: sizes no eviction could make room
        # for (per project, priority, pool, strategy, models), or that would not fit even
        # after the evicted work exits (per project, pool, models, over-quota permission).
        self.hopeless, self.no_fit_after_release = _TooBig(), _TooBig()
        # In make-room, since the last plan that evicted: per candidate group (see
        # ``_plan_candidates``) its candidates, and what they free (``_room_with_all_gone``).
        self.plan_memo: dict[tuple, object] = {}
        # Per (project, pool): its victims as far as read (see ``_pool_victims``), kept for
        # the whole cycle: what filters them does not change within one, evictions aside.
        self.victim_lists: dict[tuple[str, str], tuple[list, Iterator]] = {}
        self.evicted: set[str] = set()
        self.reserved: set[str] = set()  # placed behind evictions; bound in a later cycle
        self.decisions.timings["snapshot_s"] = time.perf_counter() - t0

    # -- 0. fair shares ---------------------------------------------------------------
    def _fair_shares(self) -> dict[tuple[str, str], int]:
        demand: dict[str, dict[str, float]] = {pool: defaultdict(float) for pool in self.pools}
        for (project, pool), milli in self.snap.usage.items():
            if pool in demand:
                demand[pool][project] += milli
        for w in self.order:
            pools = self._pools_for(w)
            if pools and w.project in self.snap.projects:
                demand[pools[0]][w.project] += self._milli(w, pools[0])
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

    # -- helpers ----------------------------------------------------------------------
    def _pools_for(self, w: Workload) -> list[str]:
        if w.node_pool is not None:
            return [w.node_pool] if w.node_pool in self.pools else []
        pools = self.project_pools.get(w.project)
        if pools is None:  # the project's pools, most quota first
            project = self.snap.projects.get(w.project)
            quota = (lambda pool: project.quotas.get(pool, Quota()).gpus) if project else (lambda pool: 0)
            pools = self.project_pools[w.project] = sorted(self.pools, key=lambda pool: (-quota(pool), pool))
        return pools

    def _milli(self, w: Workload, pool: str) -> int:
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

    def _verdict(self, w: Workload, pool: str, freed: int = 0):
        """The quota rule's answer for ``w``, as things are or with ``freed`` milli-GPU of
        its own project's work gone."""
        rule = self.quota_rules.get((w.project, pool))
        if rule is None:
            project = self.snap.projects[w.project]
            dept_quota = self._dept_quota(project.department, pool)
            key, dept = (w.project, pool), (self.work.dept_of.get(w.project, ""), pool)
            rule = self.quota_rules[key] = (
                project, dept_quota, key, dept, project.quotas.get(pool, Quota()).quota_milli, dept_quota.quota_milli
            )
        project, dept_quota, key, dept, quota, dept_in_quota_max = rule
        milli = self.milli_cache.get((w.name, pool))  # _milli, its common case written out
        if milli is None:
            milli = self._milli(w, pool)
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

    def _admitted(self, w: Workload, pool: str, strategy: str) -> bool:
        """May ``w`` take room made by ``strategy``? Fair-share reclaim also needs it to stay
        within its fair share."""
        return self._verdict(w, pool).allowed and (strategy != "fair share" or self._fits_fair_share(w, pool))

    def _place(self, w: Workload, pool: str) -> list[Choice] | None:
        """Place the whole gang in ``pool`` (taking its capacity), or nothing."""
        shape = self.shape_of.get(w.name)
        if shape is None:  # worked out once per workload and cycle
            shape = self.shape_of[w.name] = self._shape(w)
        sid, size, topo = shape
        key, group = (pool, sid), (pool, w.gpu_models)
        epoch = self.work.epoch
        if self.failed.get(key) == epoch:
            return None
        if self.no_room_epoch != epoch:  # capacity grew: what found no room may now
            self.no_room.clear()
            self.no_room_epoch = epoch
        elif self.no_room.covers(group, size):
            return None
        a = self.work.arrays
        if w.pods == 1 and topo is None:  # the common case: one try, nothing to undo
            c = self.policy.place(a, a.eligible_view(pool, w.gpu_models, w.demand), w.demand)
            if c is not None:
                self.work.take(w, [c])
                return [c]
            self.failed[key] = epoch
            self.no_room.add(group, size)
            return None
        for domain in self._domains(topo, pool):
            cp = self.work.checkpoint()
            choices: list[Choice] = []
            for _ in range(w.pods):
                if domain is None:  # the kept mask, as for a single pod
                    mask = a.eligible_view(pool, w.gpu_models, w.demand)
                else:
                    mask = a.eligible(pool, w.gpu_models, w.demand) & domain
                c = self.policy.place(a, mask, w.demand)
                if c is None:
                    break
                self.work.take(w, [c])
                choices.append(c)
            if len(choices) == w.pods:
                return choices
            self.work.rollback(cp)
        self.failed[key] = self.work.epoch
        self.no_room.add(group, size)
        return None

    def _shape(self, w: Workload) -> tuple[int, tuple | None, str | None]:
        """(a number for everything placement looks at, its pod size, its topology key)."""
        placement = (w.gpu_models, w.demand, w.pods, w.topology_key)
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

    def _bind(self, w: Workload, choices: list[Choice], over_quota: bool) -> None:
        names = self.work.arrays.names
        pods = tuple(PodPlacement(names[c.node], c.gpus, c.milli) for c in choices)
        self.decisions.binds.append(Bind(w.name, pods, over_quota))
        self.placed.add(w.name)

    def _try(self, w: Workload, allow: Callable[[str, object], bool]) -> bool:
        """Place ``w`` in the first pool whose verdict ``allow`` accepts and that has room;
        otherwise remember why it failed in its first pool."""
        why = None
        for pool in self._pools_for(w):
            v = self._verdict(w, pool)
            if not allow(pool, v):
                why = why or v.reason
                continue
            choices = self._place(w, pool)
            if choices is not None:
                self._bind(w, choices, v.over_quota)
                return True
            why = why or self._capacity_reason(w, pool)
        if why:
            self.why[w.name] = why
        return False

    def _fits_fair_share(self, w: Workload, pool: str) -> bool:
        return self.work.usage[(w.project, pool)] + self._milli(w, pool) <= self.fair.get((w.project, pool), 0)

    # -- the cycle --------------------------------------------------------------------
    def run(self) -> Decisions:
        t0 = time.perf_counter()
        waiting = self._check_known()
        self._in_quota(waiting)
        self._fair_share(waiting)
        self._leftovers(waiting)
        self._make_room(waiting)
        self._reasons()
        self.decisions.timings["actions_s"] = time.perf_counter() - t0
        return self.decisions

    def _check_known(self) -> list[Workload]:
        waiting = []
        for w in self.order:
            if w.project not in self.snap.projects:
                self.why[w.name] = f"project {w.project} does not exist"
            elif w.node_pool is not None and w.node_pool not in self.pools:
                self.why[w.name] = f"node pool {w.node_pool} does not exist"
            else:
                waiting.append(w)
        return waiting

    def _in_quota(self, waiting: list[Workload]) -> None:
        # Work in quota counting all its project's GPUs first; then guaranteed work in quota
        # only because its project's borrowed GPUs do not count (quota.counted_usage): it
        # takes idle GPUs after the teams that are inside their quota altogether.
        later = []
        waits_ahead: set[str] = set()  # projects whose guaranteed work was put off
        for w in waiting:
            if w.gives_way and w.project in waits_ahead:
                # Its project's guaranteed work ahead of it waits for idle GPUs; this would
                # take them first and be preempted for it again, once per cycle (step 2).
                continue
            if not self._try(w, lambda pool, v: v.allowed and not v.over_quota and not v.guaranteed_only):
                if not w.may_go_over_quota:
                    later.append(w)
                    waits_ahead.add(w.project)
        # Idle GPUs such work takes are over its project's whole quota: the least-served
        # project goes first, as in step 2.
        self._least_served_first(later, lambda w, pool, v: v.allowed and not v.over_quota)

    def _fair_share(self, waiting: list[Workload]) -> None:
        over = [w for w in waiting if w.name not in self.placed and w.may_go_over_quota]
        self._least_served_first(over, lambda w, pool, v: v.allowed and self._fits_fair_share(w, pool))

    def _least_served_first(self, work: list[Workload], allow: Callable[[Workload, str, object], bool]) -> None:
        """Try ``work`` (in queue order within each project) a placement at a time, always
        for the project holding the least over-quota capacity per unit of weight; a
        project's turn goes on down its queue until one of its workloads is placed."""
        queues: dict[str, list[Workload]] = defaultdict(list)
        for w in work:
            queues[w.project].append(w)
        heap = [(self._served(p), p) for p in queues]
        heapq.heapify(heap)
        nxt = dict.fromkeys(queues, 0)
        while heap:
            _, p = heapq.heappop(heap)
            q = queues[p]
            while nxt[p] < len(q):
                w = q[nxt[p]]
                nxt[p] += 1
                if self._try(w, lambda pool, v, w=w: allow(w, pool, v)):
                    break
            if nxt[p] < len(q):
                heapq.heappush(heap, (self._served(p), p))

    def _served(self, project: str) -> tuple[float, str]:
        """How much over-quota capacity a project holds per unit of weight (lower goes first)."""
        p = self.snap.projects[project]
        over = 0.0
        for pool in self.pools:
            q = p.quotas.get(pool, NO_QUOTA)
            used = self.work.usage[(project, pool)] - q.quota_milli
            over += max(0, used) / max(q.over_quota_weight, 1e-9)
        return (over, project)

    def _lag(self, project: str, pool: str) -> float:
        """Over-quota GPU-seconds the project got above (> 0) or below its share lately."""
        return self.snap.over_quota_lag.get((project, pool), 0.0)

    def _catch_up_from(self, w: Workload, pool: str) -> list[str]:
        """The projects ``w``'s project may reclaim from by fair share over time, furthest
        ahead of its share first (quota.may_catch_up)."""
        if not self.snap.over_quota_lag:  # no lag anywhere: nobody is behind (asked per plan)
            return []
        mine, milli, snap = self._lag(w.project, pool), self._milli(w, pool), self.snap
        held, fair = self.work.usage[(w.project, pool)], self.fair.get((w.project, pool), 0)
        lag = {p: self._lag(p, pool) for p in snap.projects if p != w.project and snap.victims.get(p)}
        ok = [p for p, x in lag.items() if may_catch_up(mine, x, milli, self.cfg.catch_up_s, held, fair)]
        return sorted(ok, key=lambda p: (-lag[p], p))

    def _leftovers(self, waiting: list[Workload]) -> None:
        if self.snap.over_quota_lag:  # the project furthest behind its share over time first
            waiting = sorted(waiting, key=lambda w: self._lag(w.project, (self._pools_for(w) or ("",))[0]))
        for w in waiting:
            if w.name not in self.placed and w.may_go_over_quota:
                self._try(w, lambda pool, v: v.allowed)

    # -- 4. make room -----------------------------------------------------------------
    def _make_room(self, waiting: list[Workload]) -> None:
        releasing = sorted(self.snap.releasing.values(), key=lambda r: r.name)
        if not (releasing or self.cfg.reclaim or self.cfg.fair_share_reclaim or self.cfg.preempt):
            return  # nothing to wait for and no way to make room (every plan: "no victims")
        tried: set[tuple] = set()
        fits_cache: dict[tuple, bool] = {}
        for w in waiting:
            if w.name in self.placed:
                continue
            if releasing and self._fits_after_release(w, releasing, fits_cache):
                n = len(releasing)
                self.why[w.name] = f"waiting for {n} evicted workload{'s' if n > 1 else ''} to release GPUs"
                continue
            shape = (w.demand, w.pods, w.gpu_models, w.node_pool, w.effective_priority)
            if (w.project, *shape) in tried or shape in tried:
                continue
            result = self._plan_for(w)
            if result is not True:
                # A failed plan says the same for the same shape later in this cycle: for the
                # same project always, for any project when reclaim found nothing to take.
                tried.add((w.project, *shape))
                if result == "no victims":
                    tried.add(shape)

    def _fits_after_release(self, w: Workload, releasing: list[Workload], cache: dict) -> bool:
        """Would ``w`` fit once the evicted work has exited? (Then it waits; nothing more
        is evicted for it.) Asked once per project and shape in a cycle."""
        key = (w.project, w.demand, w.pods, w.gpu_models, w.node_pool)
        group = (w.project, w.node_pool, w.gpu_models, w.may_go_over_quota)
        if key not in cache and self.no_fit_after_release.covers(group, pod_size(w)):
            cache[key] = False
        if key not in cache:
            cp = self.work.checkpoint()
            for r in releasing:
                self.work.give(r, self.work.choices_of(r))
            cache[key] = any(
                self._verdict(w, pool).allowed and self._place(w, pool) for pool in self._pools_for(w)
            )
            self.work.rollback(cp)
            if not cache[key]:
                self.no_fit_after_release.add(group, pod_size(w))
        return cache[key]

    def _plan_for(self, w: Workload) -> bool | str:
        for pool in self._pools_for(w):
            v = self._verdict(w, pool)
            strategies = []
            # Reclaim from other projects only while the project's whole usage leaves room
            # in its quota: where its own preemptible work holds the quota, that gives way
            # first (preempt, below), not another team's borrowed GPUs.
            if self.cfg.reclaim and v.allowed and not v.over_quota and not v.guaranteed_only:
                # Victims left at or above their quota first; only then below it (may_take).
                strategies += ["reclaim", "reclaim below quota"]
            if self.cfg.fair_share_reclaim and v.allowed and v.over_quota and self._fits_fair_share(w, pool):
                strategies.append("fair share")
            elif self.cfg.fair_share_reclaim and v.allowed and v.over_quota and self._catch_up_from(w, pool):
                strategies.append("catch up")  # behind its share over time: see quota.py
            if self.cfg.preempt:
                strategies.append("preempt")
            if self.cfg.reclaim and v.allowed and v.guaranteed_only:
                # Its own work gave way and that made no room: the GPUs it is guaranteed
                # are held by other projects' over-quota work, which gives way next (its own
                # preemptible work then runs over quota, where it can be reclaimed).
                strategies += ["reclaim", "reclaim below quota"]
            found_any = False
            for strategy in strategies:
                outcome = self._evict_to_fit(w, pool, strategy)
                if outcome is True:
                    return True
                found_any |= strategy == "preempt" or outcome != "no victims"
        return False if found_any else "no victims"

    def _candidates(self, w: Workload, pool: str, strategy: str) -> Iterator[tuple[Workload, int | None]]:
        """Possible victims in eviction order, each with the floor its project must keep.

        Preempt: the same project's lower-priority work. Reclaim: other projects' work,
        the project furthest above its fair share first; a victim must leave its project at
        or above its quota (reclaim) or its fair share (fair-share reclaim), or, in quota
        reclaim's second pass, below its quota only as ``may_take`` allows. Catch up: the
        over-quota work of projects ahead of their share over time, furthest ahead first."""
        snap = self.snap
        if strategy == "preempt":
            projects = [w.project]
        elif strategy == "catch up":
            projects = self._catch_up_from(w, pool)
        else:
            others = [p for p in snap.projects if p != w.project and snap.victims.get(p)]
            projects = sorted(others, key=lambda p: (self.fair.get((p, pool), 0) - self.work.usage[(p, pool)], p))
        for p in projects:
            floor = None
            if strategy in ("reclaim", "catch up"):
                floor = Floor(snap.projects[p].quotas.get(pool, NO_QUOTA).quota_milli)
            elif strategy == "reclaim below quota":
                floor = Floor(snap.projects[p].quotas.get(pool, NO_QUOTA).quota_milli, below=True)
                if self.work.usage[(p, pool)] > floor:  # at or below its quota nothing is over it
                    yield from ((v, floor) for v in self._below_quota_order(p, pool, floor))
                continue
            elif strategy == "fair share":
                floor = Floor(self.fair.get((p, pool), 0))
                if self.work.usage[(p, pool)] <= floor:
                    continue
            for prio, v, protected in self._pool_victims(p, pool):
                if strategy == "preempt" and prio >= w.effective_priority:
                    break
                if not protected:  # no strategy takes work that just restarted: that is thrash
                    yield v, floor

    def _below_quota_order(self, project: str, pool: str, quota: int) -> list[Workload]:
        """Quota reclaim's second pass takes ``project``'s pieces that each alone would take
        it below its quota first, the smallest first, then the others in eviction order. A
        smaller piece taken before a crossing one would make ``may_take`` refuse the crossing
        one (the smaller piece could fit back): this order finds a set the rule allows where
        the eviction order does not, with the fewest GPUs among single crossings."""
        used, milli_of = self.work.usage[(project, pool)], self.work.milli_of
        pieces = [v for _, v, protected in itertools.islice(self._pool_victims(project, pool), self._wide_scan())
                  if not protected]
        crossing = sorted((v for v in pieces if used - milli_of(v) < quota), key=milli_of)
        return crossing + [v for v in pieces if used - milli_of(v) >= quota]

    def _pool_victims(self, project: str, pool: str) -> Iterator[tuple[int, Workload, bool]]:
        """``project``'s running preemptible work in ``pool`` not evicted this cycle, in
        eviction order, each with its priority and whether it is protected. Filtered only
        as far as a caller reads (a plan reads the first few of thousands), once a cycle:
        state, pool and protection do not change within one, and the evicted are skipped
        as they are read."""
        key = (project, pool)
        entry = self.victim_lists.get(key)
        if entry is None:
            entry = self.victim_lists[key] = ([], iter(self.snap.victims.get(project, ())))
        out, source = entry
        evicted = self.evicted
        i = 0
        while True:
            if i < len(out):
                item = out[i]
                i += 1
                if item[1].name not in evicted:
                    yield item
                continue
            for prio, _, name in source:
                v = self.snap.workloads[name]
                if v.state == State.RUNNING and self._in_pool(v, pool):
                    out.append((prio, v, self._protected(v)))
                    break
            else:
                return

    def _protected(self, v: Workload) -> bool:
        """Just restarted after a preemption: evicting it again would be thrash."""
        now, since = self.snap.now, v.started_at
        return v.resumed and now is not None and since is not None and now - since < self.cfg.resume_protection_s

    def _in_pool(self, v: Workload, pool: str) -> bool:
        where = self.pool_of_workload.get(v.name, "")
        if where == "":
            node = self.snap.nodes.get(v.placement[0].node) if v.placement else None
            where = self.pool_of_workload[v.name] = None if node is None else node.pool
        return where == pool

    def _room_on(self, node: int, w: Workload, static: np.ndarray) -> bool:
        """Could one pod of ``w`` fit on ``node`` now? (A cheap test before a full placement.)"""
        a, d = self.work.arrays, w.demand
        if not static[node] or a.cpu_free[node] < d.cpu_milli or a.mem_free[node] < d.memory_mib:
            return False
        if d.gpus:
            return a.full_free[node] >= d.gpus
        if d.is_fractional:
            need = a.need_milli(d)
            need = need[node] if not np.isscalar(need) else need
            return bool((a.gpu_free[node] >= need).any())
        return True

    def _plan_candidates(self, w: Workload, pool: str, strategy: str) -> tuple[tuple, list]:
        """The first ``max_victim_scan`` candidates of ``_candidates`` and the key of their
        group. They depend on ``w`` only through its project (and its priority, for
        preemption; its GPUs, for catch up: ``may_catch_up`` weighs them), and on usage and
        the evicted set, which in make-room change only when a plan evicts (that clears
        ``plan_memo``): so they are worked out once per group."""
        extra = w.effective_priority if strategy == "preempt" else self._milli(w, pool) if strategy == "catch up" else None
        key = (w.project, pool, strategy, extra)
        candidates = self.plan_memo.get(key)
        if candidates is None:
            candidates = self.plan_memo[key] = list(itertools.islice(self._candidates(w, pool, strategy), self.cfg.max_victim_scan))
        return key, candidates

    def _admissible_after(self, w: Workload, pool: str, strategy: str, candidates: list, key: tuple | None = None) -> bool:
        """Would ``w`` pass its quota rule if all ``candidates`` went? Only preemption frees
        the waiting workload's own project; reclaim frees others', so its verdict stands.
        ``key``: the candidates' group in ``plan_memo`` (their sum is kept there)."""
        if strategy != "preempt":
            return self._admitted(w, pool, strategy)
        freed = self.plan_memo.get(("milli", key)) if key else None
        if freed is None:
            freed = sum(self.work.milli_of(v) for v, _ in candidates)
            if key:
                self.plan_memo[("milli", key)] = freed
        return self._verdict(w, pool, freed).allowed

    def _victims_of(self, w: Workload, pool: str, candidates: list) -> Iterator[tuple[Workload, list[Choice], int]]:
        """The candidates the trial loop of ``_evict_to_fit`` would evict if nothing fit on
        the way, with their placements and milli (without changing anything)."""
        gpu_work = w.demand.gpu_count > 0
        usage = self.work.usage
        gone: dict[str, int] = defaultdict(int)  # milli the loop would have freed, per project
        smallest: dict[str, int] = {}  # the smallest piece it would have taken, per project
        for v, floor in candidates:
            if gpu_work and not v.demand.gpu_count:
                continue
            choices = self.work.choices_of(v)
            milli = self.work.milli_of(v)
            least = min(milli, smallest.get(v.project, milli))
            if not may_take(floor, usage[(v.project, pool)] - gone[v.project] - milli, least):
                continue
            gone[v.project] += milli
            smallest[v.project] = least
            yield v, choices, milli

    def _any_victim(self, w: Workload, pool: str, candidates: list) -> bool:
        return next(self._victims_of(w, pool, candidates), None) is not None

    def _room_with_all_gone(
        self, w: Workload, pool: str, candidates: list, static: np.ndarray, key: tuple | None = None
    ) -> bool:
        """Would one pod of ``w`` have room on a node that a victim frees room on, with every
        victim the trial loop may take gone? Room only grows as victims go, so when this is
        False that loop cannot place ``w`` (it tries only such nodes): it is skipped.
        ``key``: the candidates' group in ``plan_memo``; the room per node depends on ``w``
        only through whether it asks for GPUs, and is kept there."""
        gpu_work = w.demand.gpu_count > 0
        freed = self.plan_memo.get(("freed", key, gpu_work)) if key else None
        if freed is None:
            a = self.work.arrays
            freed = {}  # node -> [GPU free per slot, CPU free, memory free]
            for v, choices, _ in self._victims_of(w, pool, candidates):
                for c in choices:
                    room = freed.get(c.node)
                    if room is None:
                        room = freed[c.node] = [a.gpu_free[c.node].tolist(), int(a.cpu_free[c.node]), int(a.mem_free[c.node])]
                    for j in c.gpus:
                        room[0][j] += c.milli
                    room[1] += v.demand.cpu_milli
                    room[2] += v.demand.memory_mib
            if key:
                self.plan_memo[("freed", key, gpu_work)] = freed
        return any(static[node] and self._fits_room(w, node, *room) for node, room in freed.items())

    def _wide_scan(self) -> int:
        return 8 * self.cfg.max_victim_scan

    def _node_plan(self, w: Workload, pool: str, strategy: str, static: np.ndarray) -> list | None:
        """Room for one pod on one node: when taking candidates in the global eviction order
        cannot make room (a pod that needs a whole node, say, while the candidates are
        spread over many), look at each node on its own: its candidates in eviction order
        until the pod fits there. The node that needs the fewest evictions wins (then the
        lowest index). Looks further down the eviction order than the global trials.

        Reclaim only (quota, fair share, catch up): there a project below its quota or fair
        share whose pods need a whole node otherwise never gets them (skewed replay: speech
        and genai). Quota reclaim once did without it, because there it took resumed work
        again (thrash); no strategy takes protected work now, and with it the replays leave
        16% less quota unserved on average (README, "Where the goals stand"). Preemption
        inside a project keeps to the global order."""
        gpu_work = w.demand.gpu_count > 0
        per_node: dict[int, list] = defaultdict(list)
        for v, floor in itertools.islice(self._candidates(w, pool, strategy), self._wide_scan()):
            if gpu_work and not v.demand.gpu_count:
                continue
            for node in {c.node for c in self.work.choices_of(v)}:
                per_node[node].append((v, floor))
        a, usage = self.work.arrays, self.work.usage
        best: list | None = None
        for node in sorted(per_node):
            if not static[node]:
                continue
            room = [a.gpu_free[node].tolist(), int(a.cpu_free[node]), int(a.mem_free[node])]
            gone: dict[str, int] = defaultdict(int)
            smallest: dict[str, int] = {}
            chosen = []
            for v, floor in per_node[node]:
                if best is not None and len(chosen) + 1 >= len(best):
                    break  # cannot beat the best node found so far
                milli = self.work.milli_of(v)
                least = min(milli, smallest.get(v.project, milli))
                if not may_take(floor, usage[(v.project, pool)] - gone[v.project] - milli, least):
                    continue
                gone[v.project] += milli
                smallest[v.project] = least
                choices = self.work.choices_of(v)
                chosen.append((v, choices))
                for c in choices:
                    if c.node == node:
                        for j in c.gpus:
                            room[0][j] += c.milli
                        room[1] += v.demand.cpu_milli
                        room[2] += v.demand.memory_mib
                if self._fits_room(w, node, *room):
                    best = chosen
                    break
        return best

    def _fits_room(self, w: Workload, node: int, gpus: list[int], cpu: int, mem: int) -> bool:
        """Would one pod of ``w`` fit on ``node`` with this much room (GPU per slot, CPU,
        memory)? Pool, model and GPU count are the caller's to check."""
        d = w.demand
        if cpu < d.cpu_milli or mem < d.memory_mib:
            return False
        if d.gpus:
            return sum(1 for x in gpus if x == MILLI) >= d.gpus
        if d.is_fractional:
            need = self.work.arrays.need_milli(d)
            nd = [need] * len(gpus) if np.isscalar(need) else need[node].tolist()
            return any(x >= n for x, n in zip(gpus, nd))
        return True

    def _evict_to_fit(self, w: Workload, pool: str, strategy: str) -> bool | str:
        """Evict candidates in order until ``w`` fits, then keep only the evictions it needs.
        Leaves ``w`` holding its room (it binds once the victims are gone)."""
        work = self.work
        cp = work.checkpoint()
        gpu_work = w.demand.gpu_count > 0
        # The candidates depend only on these (and on evictions, which clear ``hopeless``).
        group = (w.project, w.effective_priority, pool, strategy, w.gpu_models, gpu_work)
        if self.hopeless.covers(group, pod_size(w)):
            return False  # a smaller pod found victims but no room with them all gone
        key, candidates = self._plan_candidates(w, pool, strategy)
        if not candidates:
            return "no victims"
        static = work.arrays.eligible(pool, w.gpu_models, PodDemand(gpus=w.demand.gpus))
        if not self._admissible_after(w, pool, strategy, candidates, key):
            # Even evicting every candidate would not let it in: skip the trials.
            return False if any(v.demand.gpu_count or not gpu_work for v, _ in candidates) else "no victims"
        victims: list[tuple[Workload, list[Choice]]] = []
        placed = None
        if w.pods == 1 and not self._room_with_all_gone(w, pool, candidates, static, key):
            candidates = []  # the trials below cannot make room: go to the per-node plan
        smallest: dict[str, int] = {}  # the smallest piece taken so far, per project
        for v, floor in candidates:
            if gpu_work and not v.demand.gpu_count:
                continue  # CPU-only work never makes room for GPUs
            choices = work.choices_of(v)
            milli = work.milli_of(v)
            least = min(milli, smallest.get(v.project, milli))
            if not may_take(floor, work.usage[(v.project, pool)] - milli, least):
                continue
            smallest[v.project] = least
            work.give(v, choices)
            victims.append((v, choices))
            if (w.pods > 1 or any(self._room_on(c.node, w, static) for c in choices)) and self._admitted(w, pool, strategy):
                cp_try = work.checkpoint()
                placed = self._place(w, pool)
                if placed is not None:
                    work.rollback(cp_try)
                    break
        if placed is None:
            work.rollback(cp)
            if w.pods > 1 or strategy == "preempt":
                return False if victims else "no victims"
            victims = self._node_plan(w, pool, strategy, static)
            if victims is None:
                if self._any_victim(w, pool, list(itertools.islice(self._candidates(w, pool, strategy), self._wide_scan()))):
                    self.hopeless.add(group, pod_size(w))
                    return False
                return "no victims"
            for v, choices in victims:
                work.give(v, choices)
            placed = self._place(w, pool) if self._admitted(w, pool, strategy) else None
            if placed is None:
                work.rollback(cp)
                return False
        # Fewest evictions: only victims on the nodes it landed on can matter; of those,
        # spare each one it still fits without, higher priorities first.
        used = {c.node for c in placed}
        needed = [x for x in victims if any(c.node in used for c in x[1])]
        work.rollback(cp)
        for v, choices in needed:
            work.give(v, choices)
        for x in reversed(list(needed)):
            cp_spare = work.checkpoint()
            work.take(*x)
            cp_try = work.checkpoint()
            if self._admitted(w, pool, strategy) and self._place(w, pool) is not None:
                work.rollback(cp_try)
                needed.remove(x)
            else:
                work.rollback(cp_spare)
        if not (self._admitted(w, pool, strategy) and self._place(w, pool)):  # pragma: no cover - seen to fit above
            work.rollback(cp)
            return False
        self.hopeless.clear()  # evictions change what room there is and who may be taken
        self.plan_memo.clear()
        self.no_fit_after_release.clear()
        for v, _ in needed:
            self.evicted.add(v.name)
            self.decisions.evictions.append(Evict(v.name, self._evict_reason(v, w, strategy), v.grace_period_s))
        self.placed.add(w.name)
        self.reserved.add(w.name)
        projects = sorted({v.project for v, _ in needed})
        n = len(needed)
        self.why[w.name] = (
            f"{'preempting' if strategy == 'preempt' else 'reclaiming GPUs from'} "
            f"{n} workload{'s' if n > 1 else ''} of project {', '.join(projects)}; starts when they exit"
        )
        return True

    def _evict_reason(self, v: Workload, w: Workload, strategy: str) -> str:
        if strategy == "preempt":
            return f"preempted by higher-priority workload {w.name} of project {w.project}"
        if strategy == "reclaim":
            return f"reclaimed: project {w.project} is below its quota and needs the GPUs for {w.name}"
        if strategy == "reclaim below quota":
            return (
                f"reclaimed: project {w.project} is below its quota and needs the GPUs for {w.name}; "
                f"{v.name} is taken whole though project {v.project} then holds less than its quota, "
                f"as it would be over that quota if it came back"
            )
        if strategy == "catch up":
            return (
                f"reclaimed for fair share over time: project {w.project} got less than its share of "
                f"over-quota GPUs lately and needs the GPUs for {w.name}"
            )
        return f"reclaimed for fair share: project {w.project} is below its fair share and needs the GPUs for {w.name}"

    # -- 5. reasons -------------------------------------------------------------------
    def _reasons(self) -> None:
        position = 0
        for w in self.order:
            if w.name in self.placed and w.name not in self.reserved:
                continue
            position += 1
            reason = self.why.get(w.name) or self._over_quota_reason(w)
            if isinstance(reason, tuple):  # (pool, what): a capacity miss
                ahead = position - 1
                reason = f"no node in {reason[0]} has {reason[1]} free; {ahead} workload{'s' if ahead != 1 else ''} ahead"
            self.decisions.pending.append(Pending(w.name, reason, position))

    def _capacity_reason(self, w: Workload, pool: str) -> tuple[str, str]:
        anywhere = self.work.arrays.any_eligible(pool, w.gpu_models, w.demand)
        key = (pool, w.gpu_models, w.demand, w.pods, anywhere)
        reason = self.capacity_reasons.get(key)
        if reason is None:  # the same few texts for thousands of workloads: made once each
            where = f"pool {pool}" + (f" with GPU model {'/'.join(w.gpu_models)}" if w.gpu_models else "")
            if not anywhere:
                what = f"{w.demand.cpu_milli / 1000:g} CPU and {w.demand.memory_mib / 1024:g} GiB memory"
            else:
                what = describe_demand(w) if w.pods == 1 else f"room for the whole gang of {describe_demand(w)}"
            reason = self.capacity_reasons[key] = (where, what)
        return reason

    def _over_quota_reason(self, w: Workload) -> str:
        pool = self._pools_for(w)[0]
        used = self.work.usage[(w.project, pool)] / MILLI
        fair = self.fair.get((w.project, pool), 0) / MILLI
        return (
            f"project {w.project} is over its quota ({used:g} GPUs in use) and its fair share "
            f"of idle GPUs ({fair:g}) is taken"
        )
