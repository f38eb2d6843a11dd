"""What make-room keeps to answer its questions fast gives the answers of the plain ways:
the room per node with work gone (``RoomWithout``) against a node-by-node sum, each
project's victims held per GPU slot (``Snapshot.victims_hold``) against its placements,
the victims read per project (``Victims.read``) against a fresh read after evictions, and
the gang and preemption bounds (``Victims.room_for_gang``, ``OwnRoom``) against the plans
they skip."""

from __future__ import annotations

import dataclasses
import itertools
from unittest import mock

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.actions.evictions import EVICTIONS, Preempt, QuotaReclaim
from scheduler.actions.room import RoomWithout
from scheduler.actions.victims import OwnRoom, Victims
from scheduler.core import decide
from scheduler.cycle import Cycle
from scheduler.model import MILLI, PodDemand, State
from scheduler.snapshot import Snapshot

from .builders import make_node, make_workload, org, snapshot

N_NODES, N_GPUS = 3, 4


@st.composite
def clusters(draw):
    """Up to 3 nodes of 4 GPUs, three projects (quota 1 GPU each) running whole-GPU,
    fractional and CPU-only work of random priorities, and whatever a draw leaves free."""
    running, free = [], {(n, g): MILLI for n in range(N_NODES) for g in range(N_GPUS)}
    for i in range(draw(st.integers(0, 14))):
        node = draw(st.integers(0, N_NODES - 1))
        b = make_workload(f"r{i}").project(draw(st.sampled_from("abc"))).priority(draw(st.sampled_from((50, 100))))
        b = b.submitted(i).cpu(draw(st.sampled_from((0, 1000, 4000))), draw(st.sampled_from((0, 1024))))
        form = draw(st.sampled_from(("gpu", "fraction", "cpu")))
        slots = [g for g in range(N_GPUS) if free[(node, g)] == MILLI]
        if form == "gpu" and slots:
            k = draw(st.integers(1, len(slots)))
            for g in slots[:k]:
                free[(node, g)] = 0
            running.append(b.gpus(k).running((f"n{node}", tuple(slots[:k]), MILLI)).obj())
        elif form == "fraction":
            g = draw(st.integers(0, N_GPUS - 1))
            if free[(node, g)] >= 250:
                free[(node, g)] -= 250
                running.append(b.gpus(0.25).running((f"n{node}", (g,), 250)).obj())
        else:
            running.append(b.running((f"n{node}", (), 0)).obj())
    ds, ps = org(("a", 1), ("b", 1), ("c", 1))
    nodes = [make_node(f"n{i}", gpus=N_GPUS, cpu_milli=16_000, mem_mib=8192) for i in range(N_NODES)]
    return snapshot(nodes, ds, ps, running), running


demands = st.sampled_from([
    PodDemand(gpus=1, cpu_milli=1000), PodDemand(gpus=2), PodDemand(gpus=4, memory_mib=4096),
    PodDemand(gpu_fraction=0.5), PodDemand(gpu_fraction=0.25, cpu_milli=8000),
    PodDemand(gpu_memory_mib=40960), PodDemand(cpu_milli=12_000, memory_mib=6000),
])


@settings(max_examples=150, deadline=None)
@given(clusters(), st.data())
def test_room_without_work_is_the_node_by_node_sum(cluster, data):
    snap, running = cluster
    cycle = Cycle(snap)
    work, victims = cycle.work, Victims(cycle)
    picked = data.draw(st.lists(st.sampled_from(running), unique_by=lambda w: w.name)) if running else []
    gone = [(v, work.choices_of(v)) for v in picked]
    room = RoomWithout(work.arrays, gone)
    a = work.arrays
    by_node: dict[int, list] = {}  # the plain way: each node's free room, plus each pod gone
    for v, choices in gone:
        for c in choices:
            r = by_node.setdefault(c.node, [a.gpu_free[c.node].tolist(), int(a.cpu_free[c.node]), int(a.mem_free[c.node])])
            for j in c.gpus:
                r[0][j] += c.milli
            r[1] += v.demand.cpu_milli
            r[2] += v.demand.memory_mib
    assert room.nodes.tolist() == sorted(by_node)
    ask = make_workload("ask").project("a").obj()
    ask.demand = data.draw(demands)
    assert room.fits(ask).tolist() == [victims.fits_room(ask, n, *by_node[n]) for n in sorted(by_node)]
    for n in sorted(by_node):
        assert [gone[i][0] for i in room.gone_on(n)] == [v for v, cs in gone if any(c.node == n for c in cs)]


def _held_the_plain_way(snap: Snapshot, project: str) -> np.ndarray:
    a = snap.arrays
    held = np.zeros(a.gpu_free.shape, dtype=np.int64)
    for _, _, name in snap.victims.get(project, ()):
        for p in snap.workloads[name].placement:
            for g in p.gpu_indices:
                held[a.index[p.node], g] += p.gpu_milli
    return held


@settings(max_examples=100, deadline=None)
@given(clusters(), st.data())
def test_victims_hold_follows_work_as_it_comes_and_goes(cluster, data):
    snap, running = cluster
    _ = snap.arrays
    for w in data.draw(st.lists(st.sampled_from(running), unique_by=lambda w: w.name)) if running else []:
        if data.draw(st.booleans()):
            snap.remove_workload(w.name)
        else:  # evicted: still holding, no victim any more
            snap.upsert_workload(dataclasses.replace(w, state=State.RELEASING))
    if data.draw(st.booleans()):
        snap.add_node(make_node("n9", gpus=2))  # the arrays are rebuilt, and the holdings with them
    for project in "abc":
        held = snap.victims_hold(project)
        plain = _held_the_plain_way(snap, project)
        assert (plain if held is None else held).tolist() == plain.tolist()
        assert held is not None or not plain.any()


@settings(max_examples=100, deadline=None)
@given(clusters(), st.data())
def test_victims_read_so_far_are_what_a_fresh_read_gives_after_evictions(cluster, data):
    snap, running = cluster
    cycle = Cycle(snap)
    victims = Victims(cycle)
    asks = [make_workload(f"w{p}").project(p).priority(prio).gpus(1).obj() for p in "abc" for prio in (50, 100, 200)]
    ways = [s for s in EVICTIONS if isinstance(s, (QuotaReclaim, Preempt))]
    for _ in range(3):
        for w, way, n in itertools.product(asks, ways, (1, 3, 64)):
            victims.candidates(w, "default", way, n)  # read, and kept
        # A plan evicts: its victims free their GPUs, and what was read must follow.
        gone = data.draw(st.lists(st.sampled_from(running), max_size=3, unique_by=lambda w: w.name)) if running else []
        gone = [v for v in gone if v.name not in victims.evicted and v.is_preemptible]
        for v in gone:
            cycle.work.give(v, cycle.work.choices_of(v))
        victims.evicted_for(gone)
        fresh = Victims(cycle)
        fresh.evicted = set(victims.evicted)
        for w, way, n in itertools.product(asks, ways, (1, 3, 64)):
            assert victims.candidates(w, "default", way, n) == fresh.candidates(w, "default", way, n)


def _gang_case():
    # a and b (no quota) each hold 3 GPUs of a node, d holds a third node in its quota; c
    # asks for a gang of 3 x 4 GPUs: with a and b gone two nodes are free, so no plan can
    # place it.
    ds, ps = org(("a", 0), ("b", 0), ("c", 12), ("d", 4))
    running = [make_workload(f"{p}{g}").project(p).gpus(1).submitted(g).running((node, (g,), MILLI)).obj()
               for p, node, slots in (("a", "n1", 3), ("b", "n2", 3), ("d", "n3", 4)) for g in range(slots)]
    nodes = [make_node(n, gpus=4) for n in ("n1", "n2", "n3")]
    gang = make_workload("g").project("c").gpus(4).pods(3).submitted(10).obj()
    return nodes, ds, ps, running, gang


def test_the_gang_bound_rules_out_a_gang_with_too_few_nodes_and_not_one_that_fits():
    nodes, ds, ps, running, gang = _gang_case()
    cycle = Cycle(snapshot(nodes, ds, ps, [*running, gang]))
    victims = Victims(cycle)
    way = EVICTIONS[0]
    _, candidates = victims.plan_candidates(gang, "default", way)
    static = cycle.work.arrays.eligible("default", (), PodDemand(gpus=4))
    assert candidates and not victims.room_for_gang(gang, "default", candidates, static)
    two = make_workload("g2").project("c").gpus(4).pods(2).obj()
    assert victims.room_for_gang(two, "default", candidates, static)
    cpu_bound = make_workload("g3").project("c").gpus(1).cpu(100_000).pods(3).obj()  # one pod a node by CPU
    assert not victims.room_for_gang(cpu_bound, "default", candidates, static)


def _preemption_case():
    # c's own low-priority work holds 3 GPUs of two nodes, its work of the gang's priority
    # the third node: preempting what it may leaves two free nodes for a gang of 3 x 4 GPUs.
    ds, ps = org(("c", 12))
    running = [make_workload(f"c{node}{g}").project("c").priority(prio).gpus(1).submitted(g)
               .running((node, (g,), MILLI)).obj()
               for node, slots, prio in (("n1", 3, 50), ("n2", 3, 50), ("n3", 4, 100)) for g in range(slots)]
    nodes = [make_node(n, gpus=4) for n in ("n1", "n2", "n3")]
    return nodes, ds, ps, running


def test_where_the_gang_bound_rules_a_plan_out_the_cycle_decides_as_the_plan_would():
    nodes, ds, ps, running = _preemption_case()
    gang = make_workload("g").project("c").priority(100).gpus(4).pods(3).submitted(10).obj()
    answers = []
    real = Victims.room_for_gang

    def spy(self, *a, **k):
        answers.append(real(self, *a, **k))
        return answers[-1]

    with mock.patch.object(Victims, "room_for_gang", spy):
        bounded = decide(snapshot(nodes, ds, ps, [*running, gang]))
    with mock.patch.object(Victims, "room_for_gang", return_value=True):
        planned = decide(snapshot(nodes, ds, ps, [*running, gang]))
    assert False in answers
    assert bounded.evictions == planned.evictions == []
    assert (bounded.binds, bounded.pending) == (planned.binds, planned.pending)


def test_the_preemption_bound_counts_all_the_project_s_preemptible_work_and_what_is_free():
    nodes, ds, ps, running = _preemption_case()
    ask = make_workload("g").project("c").priority(100).gpus(4).pods(3).obj()
    cycle = Cycle(snapshot(nodes, ds, ps, [*running, ask]))
    static = cycle.work.arrays.eligible("default", (), PodDemand(gpus=4))
    assert OwnRoom(cycle).may_fit(ask, static)  # its own work, of any priority, holds all 12 GPUs
    four = make_workload("g4").project("c").priority(100).gpus(4).pods(4).obj()
    assert not OwnRoom(cycle).may_fit(four, static)
    other = make_workload("o").project("d").gpus(4).obj()  # no work of its own: only what is free
    assert not OwnRoom(cycle).may_fit(other, static)


def test_where_the_preemption_bound_rules_a_plan_out_the_cycle_decides_as_the_plan_would():
    # c's low-priority work holds 3 GPUs of two nodes, e holds the third: no preemption
    # inside c leaves three free nodes for its gang of 3 x 4 GPUs.
    ds, ps = org(("c", 8), ("e", 4))
    running = [make_workload(f"{p}{node}{g}").project(p).priority(50).gpus(1).submitted(g).running((node, (g,), MILLI)).obj()
               for p, node, slots in (("c", "n1", 3), ("c", "n2", 3), ("e", "n3", 4)) for g in range(slots)]
    nodes = [make_node(n, gpus=4) for n in ("n1", "n2", "n3")]
    gang = make_workload("g").project("c").priority(100).gpus(4).pods(3).submitted(10).obj()
    answers = []
    real = OwnRoom.may_fit

    def spy(self, *a):
        answers.append(real(self, *a))
        return answers[-1]

    with mock.patch.object(OwnRoom, "may_fit", spy):
        bounded = decide(snapshot(nodes, ds, ps, [*running, gang]))
    with mock.patch.object(OwnRoom, "may_fit", return_value=True):
        planned = decide(snapshot(nodes, ds, ps, [*running, gang]))
    assert False in answers
    assert (bounded.binds, bounded.evictions, bounded.pending) == (planned.binds, planned.evictions, planned.pending)
