"""The bound make-room puts on reclaim before building a plan (``OverQuotaRoom``): room a
plan could make is at most what is free plus what other projects hold over their quota."""

from __future__ import annotations

from unittest import mock

from scheduler.actions.victims import OverQuotaRoom
from scheduler.core import decide
from scheduler.cycle import Cycle
from scheduler.model import PodDemand

from .builders import make_node, make_workload, org, snapshot


def _room(*running, ask):
    # a (quota 1) and b (quota 1) hold one 4-GPU node's GPUs as given; c (quota 4) asks.
    ds, ps = org(("a", 1), ("b", 1), ("c", 4))
    snap = snapshot([make_node("n1", gpus=4)], ds, ps, [*running, ask])
    cycle = Cycle(snap)
    static = cycle.work.arrays.eligible("default", (), PodDemand(gpus=ask.demand.gpus))
    return OverQuotaRoom(cycle).may_fit(ask, "default", static)


def _gpu(name, project, slot):
    return make_workload(name).project(project).gpus(1).submitted(slot).running(("n1", (slot,), 1000)).obj()


def test_a_node_held_partly_in_quota_bounds_a_whole_node_pod_out():
    # a holds 3 GPUs (2 over its quota), b holds 1 (in quota): at most 3 whole GPUs can be
    # made free for c, so a 4-GPU pod is bounded out, and a 3-GPU pod is not.
    running = [_gpu("a0", "a", 0), _gpu("a1", "a", 1), _gpu("a2", "a", 2), _gpu("b0", "b", 3)]
    assert not _room(*running, ask=make_workload("c4").project("c").gpus(4).obj())
    assert _room(*running, ask=make_workload("c3").project("c").gpus(3).obj())


def test_free_gpus_count_towards_the_bound_and_the_asking_project_s_own_work_does_not():
    # a holds 2 over its quota (1), one GPU is free, c itself holds the last one.
    running = [_gpu("a0", "a", 0), _gpu("a1", "a", 1), _gpu("c0", "c", 3)]
    assert _room(*running, ask=make_workload("c3").project("c").gpus(3).obj())
    assert not _room(*running, ask=make_workload("c4").project("c").gpus(4).obj())


def test_a_gang_is_bounded_by_the_pods_each_node_could_hold():
    # Two 1-GPU slots held over quota by a and one in quota by b: a gang of 2 x 2 GPUs
    # cannot be made room for (one pod at most), a gang of 2 x 1 GPU can.
    running = [_gpu("a0", "a", 0), _gpu("a1", "a", 1), _gpu("a2", "a", 2), _gpu("b0", "b", 3)]
    assert not _room(*running, ask=make_workload("g").project("c").gpus(2).pods(2).obj())
    assert _room(*running, ask=make_workload("g").project("c").gpus(1).pods(2).obj())


def test_where_the_bound_rules_a_plan_out_the_cycle_decides_as_the_plan_would():
    ds, ps = org(("a", 1), ("b", 1), ("c", 4))
    running = [_gpu("a0", "a", 0), _gpu("a1", "a", 1), _gpu("a2", "a", 2), _gpu("b0", "b", 3)]
    work = [*running, make_workload("c4").project("c").gpus(4).submitted(10).obj()]
    answers = []
    real = OverQuotaRoom.may_fit

    def spy(self, w, pool, static):
        answers.append(real(self, w, pool, static))
        return answers[-1]

    with mock.patch.object(OverQuotaRoom, "may_fit", spy):
        bounded = decide(snapshot([make_node("n1", gpus=4)], ds, ps, work))
    with mock.patch.object(OverQuotaRoom, "may_fit", return_value=True):
        planned = decide(snapshot([make_node("n1", gpus=4)], ds, ps, work))
    assert False in answers
    assert bounded.evictions == planned.evictions == []
    assert (bounded.binds, bounded.pending) == (planned.binds, planned.pending)
