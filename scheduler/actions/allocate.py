"""The actions that place work on free capacity: known work, in quota, over-quota fair
share, idle leftovers. None of them evicts."""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Callable
from functools import partial

from ..cycle import Cycle
from ..model import NO_QUOTA, Workload
from ..quota import Verdict


class KnownWork:
    """Work naming a project or node pool that does not exist, or whose node constraints
    no node allows (selector, affinity, taints), waits, saying so; the rest is the cycle's
    waiting work, in queue order."""

    name = "known_work"

    def __init__(self, cycle: Cycle):
        self.cycle = cycle

    def run(self) -> None:
        c = self.cycle
        arrays = c.work.arrays
        for w in c.order:
            if w.project not in c.snap.projects:
                c.why[w.name] = f"project {w.project} does not exist"
            elif w.node_pool is not None and w.node_pool not in c.pools:
                c.why[w.name] = f"node pool {w.node_pool} does not exist"
            elif (no_node := arrays.unavailable(w.constraints)) is not None:
                c.why[w.name] = no_node
            else:
                c.waiting.append(w)


class InQuota:
    """Place work that fits its project's (and department's) quota."""

    name = "in_quota"

    def __init__(self, cycle: Cycle):
        self.cycle = cycle

    def run(self) -> None:
        # Work in quota counting all its project's GPUs first; then guaranteed work in quota
        # only because its project's borrowed GPUs do not count (quota.counted_usage): it
        # takes idle GPUs after the teams that are inside their quota altogether.
        c = self.cycle
        later = []
        waits_ahead: set[str] = set()  # projects whose guaranteed work was put off
        for w in c.waiting:
            if w.gives_way and w.project in waits_ahead:
                # Its project's guaranteed work ahead of it waits for idle GPUs; this would
                # take them first and be preempted for it again, once per cycle (make room).
                continue
            if not c.try_place(w, lambda pool, v: v.allowed and not v.over_quota and not v.guaranteed_only):
                if not w.may_go_over_quota:
                    later.append(w)
                    waits_ahead.add(w.project)
        # Idle GPUs such work takes are over its project's whole quota: the least-served
        # project goes first, as in the fair-share action.
        least_served_first(c, later, lambda w, pool, v: v.allowed and not v.over_quota)


class FairShare:
    """Place over-quota work, least-served project (by weight) first, as far as each
    project's fair share of the idle GPUs goes."""

    name = "fair_share"

    def __init__(self, cycle: Cycle):
        self.cycle = cycle

    def run(self) -> None:
        c = self.cycle
        over = [w for w in c.waiting if w.name not in c.placed and w.may_go_over_quota]
        least_served_first(c, over, lambda w, pool, v: v.allowed and c.fits_fair_share(w, pool))


class Leftovers:
    """Let over-quota work use GPUs nobody else asked for (up to limits), the project
    furthest behind its share over time first."""

    name = "leftovers"

    def __init__(self, cycle: Cycle):
        self.cycle = cycle

    def run(self) -> None:
        c = self.cycle
        waiting = c.waiting
        if c.snap.over_quota_lag:  # the project furthest behind its share over time first
            waiting = sorted(waiting, key=lambda w: c.lag(w.project, (c.pools_for(w) or ("",))[0]))
        for w in waiting:
            if w.name not in c.placed and w.may_go_over_quota:
                c.try_place(w, lambda pool, v: v.allowed)


def least_served_first(c: Cycle, work: list[Workload], allow: Callable[[Workload, str, Verdict], bool]) -> None:
    """Try ``work`` (in queue order within each project) a placement at a time, always
    for the project holding the least over-quota capacity per unit of weight; a
    project's turn goes on down its queue until one of its workloads is placed."""
    queues: dict[str, list[Workload]] = defaultdict(list)
    for w in work:
        queues[w.project].append(w)
    heap = [(served(c, p), p) for p in queues]
    heapq.heapify(heap)
    nxt = dict.fromkeys(queues, 0)
    while heap:
        _, p = heapq.heappop(heap)
        q = queues[p]
        while nxt[p] < len(q):
            w = q[nxt[p]]
            nxt[p] += 1
            if c.try_place(w, partial(allow, w)):
                break
        if nxt[p] < len(q):
            heapq.heappush(heap, (served(c, p), p))


def served(c: Cycle, project: str) -> tuple[float, str]:
    """How much over-quota capacity a project holds per unit of weight (lower goes first)."""
    p = c.snap.projects[project]
    over = 0.0
    for pool in c.pools:
        q = p.quotas.get(pool, NO_QUOTA)
        used = c.work.usage[(project, pool)] - q.quota_milli
        over += max(0, used) / max(q.over_quota_weight, 1e-9)
    return (over, project)
