"""The consolidate action (KAI-Scheduler's consolidation): a pod that needs several whole
GPUs on one node waits while the free GPUs are spread over many nodes. Where the work on
one node can all start again elsewhere in the free room now, it is moved (evicted, and
requeued as resumed work that the room elsewhere is held for), and the waiting pod takes
the node. Nobody loses GPUs: only work its project holds over its quota is moved, each
move leaves that project at or above its quota, and work that just restarted is never
moved (no thrash). With ``SchedulerConfig.consolidate_in_quota`` (on by default), a pod
within its project's fair share may also move a training inside another project's quota,
never a workspace or an inference replica: the training keeps its GPUs, on another node
free in the same cycle, and is moved at most once per resume protection (record 0050)."""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from ..cycle import Cycle
from ..guarantee import resumed_lately
from ..model import MILLI, Evict, EvictionCause, Kind, Workload
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
        self.hold: dict[str, np.ndarray | None] = {}  # per project
        self.kept: dict[str, set[str]] | None = None

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
                shape = (pool, d, w.gpu_models, w.constraints)
                if shape in tried or not c.verdict(w, pool).allowed:
                    continue
                tried.add(shape)
                if self._move_for(w, pool):
                    moves += 1
                    break

    def _kept(self) -> dict[str, set[str]]:
        """Per project, its running preemptible work that a move leaves where it is:
        evicted this cycle (by make-room), a gang, or restarted within ``resume_protection_s``."""
        if self.kept is None:
            c, snap = self.cycle, self.cycle.snap
            now, protection = snap.now, c.cfg.resume_protection_s
            names = {e.workload for e in c.decisions.evictions} | snap.holding_gangs
            for name in snap.holding_resumed:
                v = snap.workloads[name]
                if resumed_lately(v, now, protection):
                    names.add(name)
            self.kept = defaultdict(set)
            for name in names:
                held = snap.workloads.get(name)
                if held is not None:
                    self.kept[held.project].add(name)
        return self.kept

    def _movable_hold(self, project: str) -> np.ndarray | None:
        """Per GPU slot, the milli-GPUs of ``project``'s work that may be moved:
        ``Snapshot.victims_hold`` less what its kept work holds. Once per project and cycle."""
        if project not in self.hold:
            snap, a = self.cycle.snap, self.work.arrays
            held = snap.victims_hold(project)
            kept = [pods for name in self._kept().get(project, ()) if (pods := snap.victim_pods(name))]
            if held is not None and kept:
                held = held.copy()
                for pods in kept:
                    for node, gpus, milli in pods:
                        i = a.index.get(node)
                        if i is not None:
                            for g in gpus:
                                held[i, g] -= milli
            self.hold[project] = held
        return self.hold[project]

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
            kept = self._kept()
            there = self.movable[node] = []
            for name in snap.holding_on.get(name_of, ()):
                v, pods = snap.workloads[name], snap.victim_pods(name)
                if not pods or name in kept.get(v.project, ()) or v.project not in snap.projects:
                    continue
                in_quota = work.usage[(v.project, pool)] <= work.quota.get((v.project, pool), 0)
                if in_quota and not (cfg.consolidate_in_quota and v.kind == Kind.TRAINING):
                    continue
                # as filed: the same pods Snapshot.victims_hold counts
                there.extend((milli * len(gpus), name, v) for at, gpus, milli in pods if at == name_of)
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
        # Whose work could go: above the floor, only that of projects over their quota.
        projects = [p for p in c.snap.projects
                    if not floor or work.usage[(p, pool)] > work.quota.get((p, pool), 0)]
        holds = [(p, h) for p in projects if (h := self._movable_hold(p)) is not None]
        if not holds:
            return False
        movable = np.zeros_like(holds[0][1])
        for _, h in holds:
            movable += h
        # Where the floor stops no move (no project has more work there than it holds over
        # its quota), all of it goes: the node's room and its cost are sums. Elsewhere the
        # node's work is read one workload at a time, as the floor takes it.
        read = np.zeros(len(a.names), dtype=bool)
        if floor:
            for p, h in holds:
                read |= h.sum(axis=1) > work.usage[(p, pool)] - work.quota.get((p, pool), 0)
        room = a.gpu_free + movable
        ok = a.could_hold(pool, w.gpu_models, w.demand, w.constraints) & (a.full_free < d.gpus)
        summed = np.flatnonzero(ok & ~read & ((room == MILLI).sum(axis=1) >= d.gpus))
        # Nodes the pod could have with their movable work moved, the fewest GPUs to move first.
        cost = movable.sum(axis=1)
        options = [(int(cost[node]), node) for node in summed[np.lexsort((summed, cost[summed]))][:MAX_NODES].tolist()]
        for node in np.flatnonzero(ok & read & ((room >= MILLI).sum(axis=1) >= d.gpus)).tolist():
            cost_there, chosen = self._chosen(node, pool, floor)
            if int((a.gpu_free[node] + self._freed(node, chosen) == MILLI).sum()) >= d.gpus:
                options.append((cost_there, node))
        options.sort()
        for _, node in options[:MAX_NODES]:
            if self._try(w, pool, node, self._chosen(node, pool, floor)[1]):
                return True
        return False

    def _chosen(self, node: int, pool: str, floor: bool) -> tuple[int, list[Workload]]:
        """The work on ``node`` a move takes, with the milli-GPUs it holds: all that may be
        moved, less (where ``floor``) what would take its project below its quota."""
        work = self.work
        gone: dict[str, int] = defaultdict(int)
        chosen: list[Workload] = []
        cost = 0
        for milli, _, v in self._movable_on(node):
            # Work that the move would take below its project's quota goes only where the
            # floor is lifted, and only a training (record 0050).
            below = work.usage[(v.project, pool)] - gone[v.project] - milli < work.quota.get((v.project, pool), 0)
            if below and (floor or v.kind != Kind.TRAINING):
                continue
            gone[v.project] += milli
            cost += milli
            chosen.append(v)
        return cost, chosen

    def _freed(self, node: int, chosen: list[Workload]) -> np.ndarray:
        """Per GPU slot of ``node``, the milli-GPUs ``chosen`` hold there."""
        freed = np.zeros(self.work.arrays.gpu_free.shape[1], dtype=np.int64)
        for v in chosen:
            give_back(freed, node, self.work.choices_of(v))
        return freed

    def _try(self, w: Workload, pool: str, node: int, chosen: list[Workload]) -> bool:
        c, work = self.cycle, self.work
        a = work.arrays
        with work.trial() as plan:
            for v in chosen:
                work.give(v, work.choices_of(v))
            only = np.zeros(len(a.names), dtype=bool)
            only[node] = True
            spot = c.policy.place(a, a.eligible(pool, w.gpu_models, w.demand, w.constraints) & only, w.demand)
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
                mask = a.eligible(pool, v.gpu_models, v.demand, v.constraints)
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
