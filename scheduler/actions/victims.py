"""Who the make-room action may evict, and what room that frees, asked without changing
anything. Kept per cycle: the victims read so far per project and pool, and per way of
making room (less those evicted since); until a plan evicts, each candidate group's
candidates and the room they free."""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Iterator
from typing import Any, NamedTuple

import numpy as np

from ..cycle import Cycle
from ..guarantee import resumed_lately
from ..model import MILLI, State, Workload
from ..placement import Choice
from .evictions import Eviction, Floor, may_take
from .room import RoomWithout


class Candidate(NamedTuple):
    """A possible victim, with what a plan asks of it again and again, worked out once."""

    v: Workload
    floor: Floor | None  # what its project keeps (``Eviction.floor``)
    choices: list[Choice]  # its placement in the cycle's node numbering (``Working.choices_of``)
    milli: int  # the milli-GPUs it holds (``Working.milli_of``)
    gpus: bool  # whether it holds GPUs: CPU-only work never makes room for GPU work


class Victims:
    def __init__(self, cycle: Cycle):
        self.cycle = cycle
        self.snap, self.cfg, self.work = cycle.snap, cycle.cfg, cycle.work
        self.wide_scan = 8 * self.cfg.max_victim_scan  # how far past ``max_victim_scan`` some plans look
        # Per candidate group (see ``plan_candidates``) its candidates, and what they free
        # (``room_with_all_gone``); valid until a plan evicts (``evicted_for``).
        self.plan_memo: dict[tuple, Any] = {}  # candidate lists, their milli, their room per node
        # Per (project, pool): its victims as far as read (see ``pool_victims``), kept for
        # the whole cycle: what filters them does not change within one, evictions aside.
        self.victim_lists: dict[tuple[str, str], tuple[list, Iterator]] = {}
        self.evicted: set[str] = set()
        # Per (strategy key, group, project, pool, floor): what ``strategy.victims_in`` gave
        # so far, with the project's usage and evictions when it started (see ``read``).
        self.read_memo: dict[tuple, _Read] = {}
        self.evicted_from: dict[str, list[str]] = defaultdict(list)  # per project, who was evicted, in order

    def evicted_for(self, victims: list[Workload]) -> None:
        """A plan evicted ``victims``: they are no candidates any more, and what the memo
        kept (candidates, the room they free) changed with them."""
        self.plan_memo.clear()
        for v in victims:
            self.evicted.add(v.name)
            self.evicted_from[v.project].append(v.name)

    def candidates(self, w: Workload, pool: str, strategy: Eviction, n: int) -> list[Candidate]:
        """The first ``n`` possible victims in eviction order (``strategy.projects``, then
        ``strategy.victims_in``), each with the floor its project must keep
        (``strategy.floor``; none for ``w``'s own project, whose work gives way only to its
        higher priorities: ``Eviction.stops_at``)."""
        out: list[Candidate] = []
        group = strategy.group(self.cycle, w, pool)
        for p in strategy.projects(self.cycle, w, pool):
            floor = None if p == w.project else strategy.floor(self.cycle, p, pool)
            out += self.read(w, p, pool, strategy, group, floor, n - len(out))
            if len(out) >= n:
                break
        return out

    def read(self, w: Workload, project: str, pool: str, strategy: Eviction, group: object,
             floor: Floor | None, n: int) -> list[Candidate]:
        """The first ``n`` of ``strategy.victims_in`` for ``project``, each with ``floor``.
        What it gives depends on ``w`` only through ``group``, and on the cycle's state only
        through who was evicted (and the project's usage, ``Eviction.victims_read_usage``):
        so what was read is kept, less what a plan evicted since, and read on from (the
        victims are read lazily and skip the evicted as they go). Every plan for a project
        below its quota reads the same few projects furthest above theirs: this reads their
        victims once a cycle, not once a plan."""
        key = (strategy.key, group, project, pool, floor, getattr(floor, "below", False))
        used = self.work.usage[(project, pool)] if strategy.victims_read_usage else 0
        gone = self.evicted_from[project]
        entry = self.read_memo.get(key)
        if entry is None or entry.used != used or (entry.seen != len(gone) and strategy.victims_read_usage):
            work = self.work
            source = (Candidate(v, floor, work.choices_of(v), work.milli_of(v), v.demand.gpu_count > 0)
                      for v in strategy.victims_in(self, w, project, pool, floor))
            entry = self.read_memo[key] = _Read(source, used, len(gone))
        elif entry.seen != len(gone):
            entry.drop(gone)
        return entry.first(n)

    def below_quota_order(self, project: str, pool: str, quota: int) -> list[Workload]:
        """Quota reclaim's second pass takes ``project``'s pieces that each alone would take
        it below its quota first, the smallest first, then the others in eviction order. A
        smaller piece taken before a crossing one would make ``may_take`` refuse the crossing
        one (the smaller piece could fit back): this order finds a set the rule allows where
        the eviction order does not, with the fewest GPUs among single crossings. Kept
        until a plan evicts (it depends on usage and the evicted set only)."""
        key = ("below quota", project, pool, quota)
        kept = self.plan_memo.get(key)
        if kept is not None:
            return kept  # type: ignore[return-value]
        used, milli_of = self.work.usage[(project, pool)], self.work.milli_of
        pieces = [v for _, v, protected in itertools.islice(self.pool_victims(project, pool), self.wide_scan)
                  if not protected]
        crossing = sorted((v for v in pieces if used - milli_of(v) < quota), key=milli_of)
        order = self.plan_memo[key] = crossing + [v for v in pieces if used - milli_of(v) >= quota]
        return order

    def pool_victims(self, project: str, pool: str) -> Iterator[tuple[int, Workload, bool]]:
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
        evicted, workloads, nodes = self.evicted, self.snap.workloads, self.snap.nodes
        i = 0
        while True:
            while i < len(out):
                item = out[i]
                i += 1
                if item[1].name not in evicted:
                    yield item
            for prio, _, name in source:
                v = workloads[name]
                node = nodes.get(v.placement[0].node) if v.placement else None
                if v.state == State.RUNNING and node is not None and node.pool == pool:
                    out.append((prio, v, self._protected(v)))
                    break
            else:
                return

    def _protected(self, v: Workload) -> bool:
        """Just restarted after a preemption: evicting it again would be thrash."""
        return resumed_lately(v, self.snap.now, self.cfg.resume_protection_s)

    def plan_candidates(self, w: Workload, pool: str, strategy: Eviction) -> tuple[tuple, list]:
        """The first ``max_victim_scan`` candidates and the key of their group. They depend
        on ``w`` only through its project (and ``strategy.group``: its priority, for
        preemption; its GPUs, for catch up), and on usage and the evicted set, which in
        make-room change only when a plan evicts (that clears ``plan_memo``): so they are
        worked out once per group."""
        key = (w.project, pool, strategy.key, strategy.group(self.cycle, w, pool))
        candidates = self.plan_memo.get(key)
        if candidates is None:
            candidates = self.plan_memo[key] = self.candidates(w, pool, strategy, self.cfg.max_victim_scan)
        return key, candidates

    def wide(self, w: Workload, pool: str, strategy: Eviction) -> list[Candidate]:
        """The candidates further down the eviction order than ``plan_candidates`` reads:
        for the per-node plan. Kept per group as those are."""
        key = ("wide", w.project, pool, strategy.key, strategy.group(self.cycle, w, pool))
        kept = self.plan_memo.get(key)
        if kept is None:
            kept = self.plan_memo[key] = self.candidates(w, pool, strategy, self.wide_scan)
        return kept  # type: ignore[return-value]

    def admissible_after(self, w: Workload, pool: str, strategy: Eviction, candidates: list, key: tuple | None = None) -> bool:
        """Would ``w`` pass its quota rule if all ``candidates`` went? Only a strategy that
        takes from ``w``'s own project frees room in its quota; the others free other
        projects', so the verdict stands. ``key``: the candidates' group in ``plan_memo``
        (their sum is kept there)."""
        if not strategy.own_project:
            return strategy.admits(self.cycle, w, pool)
        freed = self.plan_memo.get(("milli", key)) if key else None
        if freed is None:
            freed = sum(c.milli for c in candidates)
            if key:
                self.plan_memo[("milli", key)] = freed
        return self.cycle.verdict(w, pool, freed).allowed

    def victims_of(self, w: Workload, pool: str, candidates: list) -> Iterator[tuple[Workload, list[Choice], int]]:
        """The candidates the trial loop of ``MakeRoom.evict_to_fit`` would evict if nothing
        fit on the way, with their placements and milli (without changing anything)."""
        gpu_work = w.demand.gpu_count > 0
        usage = self.work.usage
        gone: dict[str, int] = defaultdict(int)  # milli the loop would have freed, per project
        smallest: dict[str, int] = {}  # the smallest piece it would have taken, per project
        for v, floor, choices, milli, gpus in candidates:
            if gpu_work and not gpus:
                continue
            project = v.project
            least = min(milli, smallest.get(project, milli))
            if not may_take(floor, usage[(project, pool)] - gone[project] - milli, least):
                continue
            gone[project] += milli
            smallest[project] = least
            yield v, choices, milli

    def any_victim(self, w: Workload, pool: str, candidates: list) -> bool:
        return next(self.victims_of(w, pool, candidates), None) is not None

    def room_with_all_gone(
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
            gone = ((v, choices) for v, choices, _ in self.victims_of(w, pool, candidates))
            freed = RoomWithout(self.work.arrays, gone)
            if key:
                self.plan_memo[("freed", key, gpu_work)] = freed
        return bool((static[freed.nodes] & freed.fits(w)).any())

    def room_for_gang(self, w: Workload, pool: str, candidates: list, static: np.ndarray, key: tuple | None = None) -> bool:
        """Could the gang ``w``, whose pods each ask for whole GPUs, have room with every
        victim the trial loop may take gone? A node holds at most as many of its pods as
        its whole free GPUs, CPU and memory each allow: where that sums below its pods over
        the nodes it may use, no trial can place it (room only grows as victims go), and
        the loop is skipped. ``key``: as for ``room_with_all_gone``, whose room it shares."""
        d = w.demand
        freed = self.plan_memo.get(("freed", key, True)) if key else None
        if freed is None:
            gone = ((v, choices) for v, choices, _ in self.victims_of(w, pool, candidates))
            freed = RoomWithout(self.work.arrays, gone)
            if key:
                self.plan_memo[("freed", key, True)] = freed
        a = self.work.arrays
        whole, cpu, mem = a.full_free.astype(np.int64), a.cpu_free.copy(), a.mem_free.copy()
        whole[freed.nodes] = (freed.gpu == MILLI).sum(axis=1)
        cpu[freed.nodes], mem[freed.nodes] = freed.cpu, freed.mem
        pods = whole // d.gpus
        if d.cpu_milli:
            pods = np.minimum(pods, cpu // d.cpu_milli)
        if d.memory_mib:
            pods = np.minimum(pods, mem // d.memory_mib)
        return int(np.maximum(pods, 0)[static].sum()) >= w.pods

    def fits_room(self, w: Workload, node: int, gpus: list[int], cpu: int, mem: int) -> bool:
        """Would one pod of ``w`` fit on ``node`` with this much room (GPU per slot, CPU,
        memory)? Pool, model and GPU count are the caller's to check."""
        d = w.demand
        if cpu < d.cpu_milli or mem < d.memory_mib:
            return False
        if d.gpus:
            return sum(1 for x in gpus if x == MILLI) >= d.gpus
        if d.is_fractional:
            need = self.work.arrays.need_milli(d)
            nd = [need] * len(gpus) if isinstance(need, int) else need[node].tolist()
            return any(x >= n for x, n in zip(gpus, nd))
        return True

    def room_on(self, node: int, w: Workload, static: np.ndarray) -> bool:
        """Could one pod of ``w`` fit on ``node`` now? (A cheap test before a full placement.)"""
        a, d = self.work.arrays, w.demand
        if not static[node] or a.cpu_free[node] < d.cpu_milli or a.mem_free[node] < d.memory_mib:
            return False
        if d.gpus:
            return a.full_free[node] >= d.gpus
        if d.is_fractional:
            need = a.need_milli(d)
            need = need[node] if not isinstance(need, int) else need
            return bool((a.gpu_free[node] >= need).any())
        return True


class _Read:
    """What one ``victims_in`` gave so far (``Victims.read``), the rest of it still to read,
    the usage it was read at and how many of its project's evictions it has dropped."""

    __slots__ = ("got", "names", "rest", "used", "seen")

    def __init__(self, rest: Iterator[Candidate], used: int, seen: int):
        self.got: list[Candidate] = []
        self.names: list[str] = []  # the names of ``got``, found fast
        self.rest, self.used, self.seen = rest, used, seen

    def first(self, n: int) -> list[Candidate]:
        got = self.got
        if len(got) < n:
            more = list(itertools.islice(self.rest, n - len(got)))
            got += more
            self.names += [c.v.name for c in more]
        return got[:n]

    def drop(self, evicted: list[str]) -> None:
        """Forget those evicted since last asked (the rest skips them as it reads on)."""
        for name in evicted[self.seen:]:
            try:
                i = self.names.index(name)
            except ValueError:
                continue  # not read yet
            del self.got[i], self.names[i]
        self.seen = len(evicted)


class OverQuotaRoom:
    """A bound, per GPU slot, on the room reclaim from over-quota work could make: what is
    free plus what every other project over its quota holds there. Reclaim that keeps to
    over-quota projects (``Eviction.over_quota_only``) takes nothing else, so where no
    node's bound fits a pod, no plan of it can, and the plan is not built.

    Each project's holdings (``Snapshot.victims_hold``) count from when it is first seen
    over its quota at a plan; a project that goes back under keeps counting (the bound only
    loosens), and evicted work counts twice (held and free): the bound stays an upper one."""

    def __init__(self, cycle: Cycle):
        self.cycle = cycle
        self.shape = cycle.work.arrays.gpu_free.shape
        self.held: dict[str, np.ndarray] = {}  # project -> milli per slot of its preemptible work (read-only)
        self.total = np.zeros(self.shape, dtype=np.int64)

    def _add(self, project: str) -> None:
        held = self.cycle.snap.victims_hold(project)
        self.held[project] = np.zeros(self.shape, dtype=np.int64) if held is None else held
        self.total += self.held[project]

    def may_fit(self, w: Workload, pool: str, static: np.ndarray) -> bool:
        """Could evicting other projects' over-quota work in ``pool`` make room for ``w``?
        False only where it surely cannot. Asked only of work that needs several whole
        GPUs (a multi-GPU pod, a gang): room for it is rare and its plans cost the most;
        for one GPU or a fraction some node nearly always passes, and the test would cost
        more than it saves."""
        d = w.demand
        if not d.gpus or d.gpus * w.pods < 2:
            return True
        usage, quota = self.cycle.work.usage, self.cycle.work.quota
        for p in self.cycle.snap.projects:
            if p not in self.held and p != w.project and usage[(p, pool)] > quota.get((p, pool), 0):
                self._add(p)
        room = self.cycle.work.arrays.gpu_free + self.total
        own = self.held.get(w.project)
        if own is not None:
            room -= own
        return whole_gpu_room(room, static, w)


class OwnRoom:
    """The same bound for preemption (``Eviction.own_project``), which takes only the
    waiting workload's own project's preemptible work: what is free plus what that work
    holds. Asked of the same work as ``OverQuotaRoom``, before the candidates are read."""

    def __init__(self, cycle: Cycle):
        self.cycle = cycle

    def may_fit(self, w: Workload, static: np.ndarray) -> bool:
        d = w.demand
        if not d.gpus or d.gpus * w.pods < 2:
            return True
        room = self.cycle.work.arrays.gpu_free
        held = self.cycle.snap.victims_hold(w.project)
        return whole_gpu_room(room if held is None else room + held, static, w)


def whole_gpu_room(room: np.ndarray, static: np.ndarray, w: Workload) -> bool:
    """Would nodes in ``static`` with ``room`` (milli per GPU slot) hold every pod of
    ``w``, counting whole GPUs only (``w`` asks for whole GPUs)?"""
    full = (room >= MILLI).view(np.uint8)
    whole = full @ np.ones(full.shape[1], dtype=np.uint8)  # per node: a sum, several times faster
    whole[~static] = 0  # cheaper than selecting the rows of ``static`` first (a copy)
    return int((whole // w.demand.gpus).sum()) >= w.pods
