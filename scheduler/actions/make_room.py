"""The make-room action: for work still waiting, wait for evicted work to exit where that
is enough, else evict, with the ways of ``evictions.EVICTIONS`` in their order, the fewest
workloads that make room. The waiting workload holds the room it made (it binds in a later
cycle, once its victims are gone)."""

from __future__ import annotations

import time
from collections import defaultdict

import numpy as np

from ..cycle import Cycle, TooBig, pod_size
from ..model import MILLI, Evict, PodDemand, Workload
from ..placement import Choice
from .evictions import EVICTIONS, Eviction, may_take
from .room import RoomWithout, give_back
from .victims import OverQuotaRoom, OwnRoom, Victims


class MakeRoom:
    name = "make_room"

    def __init__(self, cycle: Cycle):
        self.cycle = cycle
        self.work = cycle.work
        self.strategies = [s for s in EVICTIONS if s.enabled(cycle.cfg)]
        self.victims = Victims(cycle)
        self.over_quota_room, self.own_room = OverQuotaRoom(cycle), OwnRoom(cycle)
        # Since the last plan that evicted: sizes no eviction could make room for (per
        # project, priority, pool, strategy, models).
        self.hopeless = TooBig()
        # Each way of making room is timed on its own, summed over the plans it made.
        self.timings = cycle.decisions.timings
        for s in EVICTIONS:
            self.timings[self._timing(s)] = 0.0

    def _timing(self, strategy: Eviction) -> str:
        return f"{self.name}.{strategy.name}_s"

    def run(self) -> None:
        c = self.cycle
        releasing = sorted(c.snap.releasing.values(), key=lambda r: r.name)
        if not (releasing or self.strategies):
            return  # nothing to wait for and no way to make room (every plan: "no victims")
        tried: set[tuple] = set()
        waits = self._waiting_for_release(releasing) if releasing else set()
        for w in c.waiting:
            if w.name in c.placed:
                continue
            if w.name in waits:
                n = len(releasing)
                c.why[w.name] = f"waiting for {n} evicted workload{'s' if n > 1 else ''} to release GPUs"
                continue
            shape = (w.demand, w.pods, w.gpu_models, w.node_pool, w.effective_priority, w.constraints)
            if (w.project, *shape) in tried or shape in tried:
                continue
            result = self._plan_for(w)
            if result is not True:
                # A failed plan says the same for the same shape later in this cycle: for the
                # same project always, for any project when reclaim found nothing to take.
                tried.add((w.project, *shape))
                if result == "no victims":
                    tried.add(shape)

    def _waiting_for_release(self, releasing: list[Workload]) -> set[str]:
        """The waiting work that would fit once the evicted work has exited: it waits,
        and nothing more is evicted for it. Asked in queue order, in one view of the
        cluster with that work gone. Work in its quota (the guarantee) holds the room it
        would take there, and the next asks beside it: room one eviction frees goes to as
        many of them as it holds, and the others make room of their own at once, instead
        of finding it taken when it comes free and evicting a grace period later (record
        0070). Over-quota work asks beside what is held, holding none: it may wait for room
        that comes free some other way. A "no" is kept per project and shape (and pod size:
        what is held only grows)."""
        c, work = self.cycle, self.work
        out: set[str] = set()
        known: dict[tuple, bool] = {}  # over-quota answers per project and shape
        no_fit = TooBig()
        with work.trial():
            for r in releasing:
                work.give(r, work.choices_of(r))
            for w in c.waiting:
                if w.name in c.placed:
                    continue
                key = (w.project, w.demand, w.pods, w.gpu_models, w.node_pool, w.constraints)
                group = (w.project, w.node_pool, w.gpu_models, w.may_go_over_quota, w.constraints)
                if known.get(key) is False or no_fit.covers(group, pod_size(w)):
                    continue
                pools = c.pools_for(w)
                in_quota = bool(pools) and not c.verdict(w, pools[0]).over_quota
                if not in_quota and known.get(key):
                    out.add(w.name)
                    continue
                with work.trial() as held:
                    placed = None
                    for pool in pools:
                        if c.verdict(w, pool).allowed:
                            placed = c.place(w, pool)
                            if placed:
                                break
                    if placed and in_quota:
                        held.keep()  # the room it waits for is its own
                if placed:
                    out.add(w.name)
                    if not in_quota:
                        known[key] = True
                else:
                    known[key] = False
                    no_fit.add(group, pod_size(w))
        return out

    def _plan_for(self, w: Workload) -> bool | str:
        c = self.cycle
        for pool in c.pools_for(w):
            v = c.verdict(w, pool)
            strategies = [s for s in self.strategies if s.applies(c, w, pool, v)]
            found_any = False
            for strategy in strategies:
                t0 = time.perf_counter()
                outcome = self.evict_to_fit(w, pool, strategy)
                self.timings[self._timing(strategy)] += time.perf_counter() - t0
                if outcome is True:
                    return True
                found_any |= strategy.own_project or outcome != "no victims"
        return False if found_any else "no victims"

    def evict_to_fit(self, w: Workload, pool: str, strategy: Eviction) -> bool | str:
        """Evict candidates in order until ``w`` fits, then keep only the evictions it needs.
        Leaves ``w`` holding its room (it binds once the victims are gone)."""
        c, work, victims_ = self.cycle, self.work, self.victims
        with work.trial() as plan:
            gpu_work = w.demand.gpu_count > 0
            # The candidates depend only on these (and on evictions, which clear ``hopeless``).
            group = (w.project, w.effective_priority, pool, strategy.key, w.gpu_models, gpu_work, w.constraints)
            if self.hopeless.covers(group, pod_size(w)):
                return False  # a smaller pod found victims but no room with them all gone
            static = work.arrays.eligible(pool, w.gpu_models, PodDemand(gpus=w.demand.gpus), w.constraints)
            if strategy.own_project and not self.own_room.may_fit(w, static):
                # No node could have room with all its project's preemptible work gone. (Which
                # "no" does not matter: a plan from its own project says nothing about others'.)
                return False
            key, candidates = victims_.plan_candidates(w, pool, strategy)
            if not candidates:
                return "no victims"
            if not victims_.admissible_after(w, pool, strategy, candidates, key):
                # Even evicting every candidate would not let it in: skip the trials.
                return False if any(x.gpus or not gpu_work for x in candidates) else "no victims"
            if strategy.over_quota_only and not self.over_quota_room.may_fit(w, pool, static):
                # No node could have room with every possible victim gone: what the plan
                # below would answer, without building it.
                if w.pods == 1 and strategy.per_node_plan:
                    if victims_.any_victim(w, pool, candidates) or victims_.any_victim(w, pool, victims_.wide(w, pool, strategy)):
                        self.hopeless.add(group, pod_size(w))
                        return False
                    return "no victims"
                return False if victims_.any_victim(w, pool, candidates) else "no victims"
            if w.pods > 1 and w.demand.gpus and not victims_.room_for_gang(w, pool, candidates, static, key):
                # Not even every candidate gone leaves room for the gang: what the trials
                # below would answer, without them.
                return False if victims_.any_victim(w, pool, candidates) else "no victims"
            victims: list[tuple[Workload, list[Choice]]] = []
            placed = None
            if w.pods == 1 and (strategy.node_plan_first or not victims_.room_with_all_gone(w, pool, candidates, static, key)):
                candidates = []  # the trials below cannot make room (or are not asked): the per-node plan
            smallest: dict[str, int] = {}  # the smallest piece taken so far, per project
            for v, floor, choices, milli, gpus in candidates:
                if gpu_work and not gpus:
                    continue  # CPU-only work never makes room for GPUs
                least = min(milli, smallest.get(v.project, milli))
                if not may_take(floor, work.usage[(v.project, pool)] - milli, least):
                    continue
                smallest[v.project] = least
                work.give(v, choices)
                victims.append((v, choices))
                if (w.pods > 1 or any(victims_.room_on(x.node, w, static) for x in choices)) and strategy.admits(c, w, pool):
                    with work.trial():  # does it fit now? (placed for good below)
                        placed = c.place(w, pool)
                    if placed is not None:
                        break
            if placed is None:
                plan.undo()
                if w.pods > 1 or not strategy.per_node_plan:
                    return False if victims else "no victims"
                on_one_node = self._node_plan(w, pool, strategy, static)
                if on_one_node is None:
                    if victims_.any_victim(w, pool, victims_.wide(w, pool, strategy)):
                        self.hopeless.add(group, pod_size(w))
                        return False
                    return "no victims"
                victims = on_one_node
                for v, choices in victims:
                    work.give(v, choices)
                placed = c.place(w, pool) if strategy.admits(c, w, pool) else None
                if placed is None:
                    return False
            # Fewest evictions: only victims on the nodes it landed on can matter; of those,
            # spare each one it still fits without, higher priorities first.
            used = {x.node for x in placed}
            needed = [x for x in victims if any(y.node in used for y in x[1])]
            # Every victim needed and none spared: the cluster is as it was when ``placed`` was
            # found (the same work gone, in the same order), and placement depends on that alone.
            as_found = len(needed) == len(victims) and w.pods == 1
            plan.undo()
            for v, choices in needed:
                work.give(v, choices)
            for x in reversed(list(needed)):
                with work.trial() as spare:
                    work.take(*x)
                    with work.trial():
                        fits = strategy.admits(c, w, pool) and c.place(w, pool) is not None
                    if fits:
                        spare.keep()
                        needed.remove(x)
                        as_found = False
            if as_found:
                work.take(w, placed)
            elif not (strategy.admits(c, w, pool) and c.place(w, pool)):  # pragma: no cover - seen to fit above
                return False
            plan.keep()
        self.hopeless.clear()  # evictions change what room there is and who may be taken
        victims_.evicted_for([v for v, _ in needed])
        for v, _ in needed:
            c.decisions.evictions.append(Evict(v.name, strategy.reason(v, w), v.grace_period_s, strategy.cause_of(v, w)))
        c.placed.add(w.name)
        c.reserved.add(w.name)
        projects = sorted({v.project for v, _ in needed})
        n = len(needed)
        c.why[w.name] = (
            f"{strategy.verb} {n} workload{'s' if n > 1 else ''} of project {', '.join(projects)}; starts when they exit"
        )
        return True

    def _node_plan(self, w: Workload, pool: str, strategy: Eviction,
                   static: np.ndarray) -> list[tuple[Workload, list[Choice]]] | None:
        """Room for one pod on one node: when taking candidates in the global eviction order
        cannot make room (a pod that needs a whole node, say, while the candidates are
        spread over many), look at each node on its own: its candidates in eviction order
        until the pod fits there. The node that needs the fewest evictions wins (then the
        lowest index). Looks further down the eviction order than the global trials.

        Reclaim only (quota, fair share, catch up: ``Eviction.per_node_plan``): there a
        project below its quota or fair share whose pods need a whole node otherwise never
        gets them (skewed replay: speech and genai). Quota reclaim once did without it,
        because there it took resumed work again (thrash); no strategy takes protected work
        now, and with it the replays leave 16% less quota unserved on average (README,
        "Where the goals stand"). Preemption inside a project keeps to the global order."""
        work = self.work
        gpu_work = w.demand.gpu_count > 0
        # The candidates, and the room per node with them all gone, depend on ``w`` as the
        # global ones do (``plan_candidates``): worked out once per group until a plan evicts.
        memo = self.victims.plan_memo
        key = ("per node", w.project, pool, strategy.key, strategy.group(self.cycle, w, pool), gpu_work)
        a = work.arrays
        kept = memo.get(key)
        if kept is None:
            wide = [c for c in self.victims.wide(w, pool, strategy) if c.gpus or not gpu_work]
            kept = memo[key] = (wide, RoomWithout(a, ((c.v, c.choices) for c in wide)))
        wide, most = kept  # type: ignore[misc]
        # A node where even every candidate there gone leaves no room for the pod is passed over.
        best: list[tuple[Workload, list[Choice]]] | None = None
        for node in most.nodes[static[most.nodes] & most.fits(w)].tolist():
            if best is not None and len(best) == 1:
                break  # no node needs fewer evictions than one
            here = [wide[i] for i in most.gone_on(node)]
            # Where eviction order finds no room, it tries again with only the work that can
            # free room the pod can use: for whole GPUs, the work on GPUs that could come
            # wholly free; for a fraction, the work on one GPU at a time. Pieces elsewhere
            # free nothing it can use, and taking them first can use up their project's room
            # above the floor before the piece that would have made room is reached.
            tries = [here]
            if w.demand.gpus:
                tries.append(self._on_clearable_gpus(here, node, pool))
            elif w.demand.gpu_count:  # a fraction: one GPU at a time
                slots = sorted({j for x in here for c in x[2] if c.node == node for j in c.gpus})
                tries += [[x for x in here if any(c.node == node and j in c.gpus for c in x[2])] for j in slots]
            for i, candidates in enumerate(tries):
                if candidates in tries[:i]:
                    continue  # walked already: the same candidates give the same answer
                chosen = self._take_on_node(w, node, pool, candidates, best)
                if chosen is not None:
                    best = chosen
                    break
            else:
                # Walking in order can refuse a piece the rule allows alone: below a
                # project's quota ``may_take`` weighs the smallest piece taken, so a small
                # piece taken first that made no room shuts out a larger one that would
                # have. One victim alone is the fewest a node can need: each is asked.
                if best is None and any(x[1] is not None and x[1].below for x in here):
                    for x in here:
                        chosen = self._take_on_node(w, node, pool, [x], best)
                        if chosen is not None:
                            best = chosen
                            break
        return best

    def _on_clearable_gpus(self, here: list, node: int, pool: str) -> list:
        """Of the candidates on ``node``, those with a GPU there that could come wholly free:
        its free milli plus what the candidates of projects above their floor hold on it."""
        usage = self.work.usage
        could = self.work.arrays.gpu_free[node].tolist()
        for v, floor, choices, _, _ in here:
            if floor is None or usage[(v.project, pool)] > floor:
                give_back(could, node, choices)
        clear = {j for j, m in enumerate(could) if m >= MILLI}
        return [x for x in here if any(c.node == node and clear.intersection(c.gpus) for c in x[2])]

    def _take_on_node(self, w: Workload, node: int, pool: str, candidates: list,
                      best: list | None) -> list[tuple[Workload, list[Choice]]] | None:
        """``candidates`` (on ``node``) in eviction order until ``w`` fits there, as the
        reclaim rule allows; None if it does not fit, or only with no fewer than ``best``."""
        a, usage = self.work.arrays, self.work.usage
        room = [a.gpu_free[node].tolist(), int(a.cpu_free[node]), int(a.mem_free[node])]
        gone: dict[str, int] = defaultdict(int)
        smallest: dict[str, int] = {}
        chosen: list[tuple[Workload, list[Choice]]] = []
        for v, floor, choices, milli, _ in candidates:
            if best is not None and len(chosen) + 1 >= len(best):
                return None  # cannot beat the best node found so far
            least = min(milli, smallest.get(v.project, milli))
            if not may_take(floor, usage[(v.project, pool)] - gone[v.project] - milli, least):
                continue
            gone[v.project] += milli
            smallest[v.project] = least
            chosen.append((v, choices))
            pods = give_back(room[0], node, choices)
            room[1] += pods * v.demand.cpu_milli
            room[2] += pods * v.demand.memory_mib
            if self.victims.fits_room(w, node, *room):
                return chosen
        return None
