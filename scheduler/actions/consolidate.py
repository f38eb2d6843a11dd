"""The consolidate action (KAI-Scheduler's consolidation): a pod that needs several whole
GPUs on one node waits while the free GPUs are spread over many nodes. Where the work on
one node can all start again elsewhere in the free room now, it is moved (evicted, and
requeued as resumed work that the room elsewhere is held for), and the waiting pod takes
the node. Nobody loses GPUs: only work its project holds over its quota is moved, each
move leaves that project at or above its quota, and work that just restarted is never
moved (no thrash). With ``SchedulerConfig.consolidate_in_quota``, a pod within its
project's fair share may also move work inside another project's quota (KAI-Scheduler's
consolidation moves any preemptible work): that work keeps its GPUs, on another node."""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from ..cycle import Cycle
from ..model import MILLI, Evict, EvictionCause, State, Workload
from ..placement import Choice
from .room import give_back

# Moves per cycle, and nodes tried per waiting pod: each move restarts work, and a cycle
# must stay short at any scale.
MAX_MOVES, MAX_NODES = 1, 4


class Consolidate:
    name = "consolidate"

    def __init__(self, cycle: Cycle):
        self.cycle = cycle
        self.work = cycle.work
        self.movable: dict[int, list[tuple[int, str, Workload]]] = {}  # per node
        self.bounds: dict[tuple[str, tuple[str, ...]], np.ndarray] = {}
        self.evicted: set[str] | None = None

    def run(self) -> None:
        c = self.cycle
        if not c.cfg.reclaim:
            return
        moves, tried = 0, set()
        for w in c.waiting:
            if moves >= MAX_MOVES:
                return
            d = w.demand
            if w.name in c.placed or w.pods != 1 or d.gpus < 2:
                continue
            for pool in c.pools_for(w):
                shape = (pool, d, w.gpu_models)
                if shape in tried or not c.verdict(w, pool).allowed:
                    continue
                tried.add(shape)
                if self._move_for(w, pool):
                    moves += 1
                    break

    def _bound(self, pool: str, projects: tuple[str, ...]) -> np.ndarray:
        """Per GPU slot, the milli-GPUs that ``projects``' running preemptible work holds
        (``Snapshot.victims_hold``): at most what moving their work could free."""
        key = (pool, projects)
        bound = self.bounds.get(key)
        if bound is None:
            bound = np.zeros(self.work.arrays.gpu_free.shape, dtype=np.int64)
            for p in projects:
                held = self.cycle.snap.victims_hold(p)
                if held is not None:
                    bound += held
            self.bounds[key] = bound
        return bound

    def _movable_on(self, node: int) -> list[tuple[int, str, Workload]]:
        """The single-pod work on ``node`` that may be moved, as (milli-GPUs, name,
        workload) by milli then name: running, preemptible, not just restarted, not evicted
        this cycle, of a project over its quota in the node's pool (of any project with
        ``consolidate_in_quota``). Read once per node and cycle (the quota floor is applied
        per move)."""
        there = self.movable.get(node)
        if there is None:
            c, work = self.cycle, self.work
            snap, cfg = c.snap, c.cfg
            pool, name_of = work.pool_of(node), work.arrays.names[node]
            if self.evicted is None:
                self.evicted = {e.workload for e in c.decisions.evictions}  # by make-room, this cycle
            there = self.movable[node] = []
            for name in snap.holding_on.get(name_of, ()):
                v = snap.workloads[name]
                if v.state != State.RUNNING or not v.is_preemptible or v.pods != 1 or name in self.evicted \
                        or v.project not in snap.projects:
                    continue
                if not cfg.consolidate_in_quota \
                        and work.usage[(v.project, pool)] <= work.quota.get((v.project, pool), 0):
                    continue
                if v.resumed and snap.now is not None and v.started_at is not None \
                        and snap.now - v.started_at < cfg.resume_protection_s:
                    continue
                for pl in v.placement:
                    if pl.node == name_of:
                        there.append((pl.gpu_milli * len(pl.gpu_indices), name, v))
            there.sort(key=lambda e: (e[0], e[1]))
        return there

    def _move_for(self, w: Workload, pool: str) -> bool:
        c, work = self.cycle, self.work
        a = work.arrays
        d = w.demand
        free_total = int(np.clip(a.gpu_free[a.pool_id == c.pools.index(pool)], 0, None).sum())
        if free_total < d.gpus * MILLI:
            return False  # moving conserves the free GPUs: there are not enough of them
        # Below the quota floor only for a pod its project's fair share covers: work in
        # quota then moves for the share it is owed, never for borrowing beyond it.
        floor = not (c.cfg.consolidate_in_quota and c.fits_fair_share(w, pool))
        # Whose work could go at all: above the floor, only that of projects over their quota.
        projects = tuple(p for p in c.snap.projects
                         if not floor or work.usage[(p, pool)] > work.quota.get((p, pool), 0))
        # Nodes big enough for the pod (GPUs, CPU, memory), not already free for it, where
        # all that work gone would leave enough whole GPUs (moving part of it frees no more).
        bound = a.gpu_free + self._bound(pool, projects)
        nodes = np.flatnonzero(a.could_hold(pool, w.gpu_models, w.demand) & (a.full_free < d.gpus)
                               & ((bound >= MILLI).sum(axis=1) >= d.gpus))
        # Nodes the pod could have with their movable work moved, the fewest GPUs to move first.
        options = []
        for node in nodes.tolist():
            room = a.gpu_free[node].copy()
            gone: dict[str, int] = defaultdict(int)
            chosen: list[Workload] = []
            cost = 0
            for milli, _, v in self._movable_on(node):
                if floor and work.usage[(v.project, pool)] - gone[v.project] - milli < work.quota.get((v.project, pool), 0):
                    continue
                gone[v.project] += milli
                cost += milli
                chosen.append(v)
                give_back(room, node, work.choices_of(v))
            if chosen and int((room == MILLI).sum()) >= d.gpus:
                options.append((cost, node, chosen))
        options.sort(key=lambda o: (o[0], o[1]))
        for _, node, chosen in options[:MAX_NODES]:
            if self._try(w, pool, node, chosen):
                return True
        return False

    def _try(self, w: Workload, pool: str, node: int, chosen: list[Workload]) -> bool:
        c, work = self.cycle, self.work
        a = work.arrays
        with work.trial() as plan:
            for v in chosen:
                work.give(v, work.choices_of(v))
            only = np.zeros(len(a.names), dtype=bool)
            only[node] = True
            spot = c.policy.place(a, a.eligible(pool, w.gpu_models, w.demand) & only, w.demand)
            if spot is None:
                return False
            work.take(w, [spot])
            # Fewest moves: a victim whose GPUs the pod did not take stays.
            used = set(spot.gpus)
            stay = [v for v in chosen if not any(set(ch.gpus) & used for ch in work.choices_of(v))]
            moved = [v for v in chosen if v not in stay]
            for v in stay:
                if not self._fits(v, work.choices_of(v)):
                    return False
                work.take(v, work.choices_of(v))
            elsewhere: list[tuple[Workload, list[Choice]]] = []
            for v in moved:
                mask = a.eligible(pool, v.gpu_models, v.demand)
                mask[node] = False
                spot_v = c.policy.place(a, mask, v.demand)
                if spot_v is None:
                    return False
                work.take(v, [spot_v])
                elsewhere.append((v, [spot_v]))
            plan.keep()
        for v in moved:
            c.decisions.evictions.append(Evict(
                v.name,
                f"moved: {w.name} of project {w.project} needs {w.demand.gpus} GPUs on one node; "
                f"{v.name} restarts on another node, where room is free for it",
                v.grace_period_s, EvictionCause.CONSOLIDATE))
        c.placed.add(w.name)
        c.reserved.add(w.name)
        n = len(moved)
        c.why[w.name] = f"moving {n} workload{'s' if n > 1 else ''} to free a whole node; starts when they exit"
        return True

    def _fits(self, v: Workload, choices: list[Choice]) -> bool:
        """Is the room ``v`` held (GPUs, CPU, memory) still free, for it to stay?"""
        a, d = self.work.arrays, v.demand
        return all(
            a.cpu_free[ch.node] >= d.cpu_milli and a.mem_free[ch.node] >= d.memory_mib
            and all(a.gpu_free[ch.node][g] >= ch.milli for g in ch.gpus)
            for ch in choices
        )
