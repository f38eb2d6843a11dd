"""The startable reading (record 0051): whether the rules let a waiting pod start, and what
holds it back when they do not, on hand cases."""

from __future__ import annotations

import pytest

from scheduler.model import Kind
from scheduler.sim.startable import CAUSES, Holdings

from .scheduler.builders import make_node, make_workload, org, snapshot


def _case(holder, a_quota: float = 4, a_held: int | None = None):
    # One 4-GPU node. ``holder`` (of project a, or of b itself) holds all of it; b waits
    # with a 4-GPU training inside its quota.
    ds, ps = org(("a", a_quota), ("b", 4))
    wait = make_workload("b1").project("b").gpus(4).submitted(10).obj()
    snap = snapshot([make_node("n1", gpus=4)], ds, ps, [holder, wait])
    held = {"a": 4000 if a_held is None else a_held, "b": 0}
    if holder.project == "b":
        held = {"a": 0, "b": 4000}
    return Holdings(snap, held, {"a": int(a_quota * 1000), "b": 4000}), wait


def _on_n1(name: str, project: str = "a"):
    return make_workload(name).project(project).gpus(4).submitted(1).running(("n1", (0, 1, 2, 3), 1000))


def test_another_project_s_work_in_its_quota_holds_the_pod_back():
    h, w = _case(_on_n1("a1").obj())
    assert not h.could_start(w) and h.hold_causes(w) == {CAUSES[2]}
    assert not h.fits_free(w)


def test_another_project_s_work_over_its_quota_may_be_taken():
    h, w = _case(_on_n1("a1").obj(), a_quota=0)
    assert h.could_start(w) and not h.fits_free(w)


@pytest.mark.parametrize("kind", [Kind.WORKSPACE, Kind.INFERENCE])
def test_work_that_is_not_preemptible_holds_the_pod_back_even_over_its_quota(kind):
    h, w = _case(_on_n1("a1").kind(kind).preemptible(False).obj(), a_quota=0)
    assert not h.could_start(w) and h.hold_causes(w) == {CAUSES[0]}


def test_the_pod_s_own_project_s_work_of_its_priority_or_higher_holds_it_back():
    h, w = _case(_on_n1("b0", project="b").obj())
    assert not h.could_start(w) and h.hold_causes(w) == {CAUSES[1]}
    h, w = _case(_on_n1("b0", project="b").priority(-10).obj())  # lower priority: preempted for it
    assert h.could_start(w)


def test_a_pod_no_node_is_big_enough_for_is_held_back_by_that():
    # Two empty 4-GPU nodes: eight GPUs in all, but none holds an 8-GPU pod.
    ds, ps = org(("a", 4), ("b", 4))
    wait = make_workload("b8").project("b").gpus(8).submitted(10).obj()
    nodes = [make_node("n1", gpus=4), make_node("n2", gpus=4)]
    h = Holdings(snapshot(nodes, ds, ps, [wait]), {"a": 0, "b": 0}, {"a": 4000, "b": 4000})
    assert not h.could_start(wait) and h.hold_causes(wait) == {CAUSES[3]}


def test_work_restarted_lately_holds_the_pod_back_as_the_rules_keep_it():
    # a's training over a's quota would be taken, but it restarted after an eviction 60 s
    # ago: the rules keep it (thrash), so the meter must too (scheduler.guarantee).
    import dataclasses

    resumed = dataclasses.replace(_on_n1("a1").obj(), resumed=True, started_at=940.0)
    ds, ps = org(("a", 0), ("b", 4))
    wait = make_workload("b1").project("b").gpus(4).submitted(10).obj()
    snap = snapshot([make_node("n1", gpus=4)], ds, ps, [resumed, wait])
    snap.now = 1000.0
    h = Holdings(snap, {"a": 4000, "b": 0}, {"a": 0, "b": 4000})
    assert not h.could_start(wait) and h.hold_causes(wait) == {CAUSES[4]}
    snap.now = 1000.0 + snap.config.resume_protection_s  # the protection has run out
    assert Holdings(snap, {"a": 4000, "b": 0}, {"a": 0, "b": 4000}).could_start(wait)


def test_a_workspace_that_borrowed_over_its_quota_may_be_taken():
    # Not preemptible, but placed over a's quota: it borrowed the GPUs, and b, below its
    # quota, may take them back.
    import dataclasses

    ws = dataclasses.replace(_on_n1("a1").kind(Kind.WORKSPACE).over_quota().obj(), over_quota=True)
    h, w = _case(ws, a_quota=0)
    assert h.could_start(w)


def _pieces(project: str, n: int, node: str = "n1"):
    return [make_workload(f"{project}{i}").project(project).gpus(1).submitted(1).running((node, (i,), 1000)).obj()
            for i in range(n)]


def test_room_being_released_is_a_reclaim_in_flight_not_room_to_start():
    # a's borrowed training was evicted for b and is releasing its GPUs: the rules took
    # that room already, and b's pod waits for it whatever they decide now.
    import dataclasses

    from scheduler.model import State

    releasing = dataclasses.replace(_on_n1("a1").obj(), state=State.RELEASING)
    h, w = _case(releasing, a_quota=0)
    assert not h.could_start(w) and h.hold_causes(w) == {CAUSES[5]}
    assert not h.fits_free(w)


def test_another_project_keeps_what_the_reclaim_rule_leaves_it():
    # a (quota 3) holds four 1-GPU trainings, one GPU over its quota. Room for b's 4-GPU pod
    # takes all four, leaving a at 0, and each would fit back in a's quota: the reclaim
    # rule (``may_take``) does not take them, so b's pod could not start.
    ds, ps = org(("a", 3), ("b", 4))
    wait = make_workload("b1").project("b").gpus(4).submitted(10).obj()
    snap = snapshot([make_node("n1", gpus=4)], ds, ps, [*_pieces("a", 4), wait])
    h = Holdings(snap, {"a": 4000, "b": 0}, {"a": 3000, "b": 4000})
    assert not h.could_start(wait, 4000) and h.hold_causes(wait, 4000) == {CAUSES[2]}
    # One 4-GPU piece instead would be over a's quota if it came back: taken whole.
    snap = snapshot([make_node("n1", gpus=4)], ds, ps, [_on_n1("a1").obj(), wait])
    assert Holdings(snap, {"a": 4000, "b": 0}, {"a": 3000, "b": 4000}).could_start(wait, 4000)


def test_a_pod_over_its_quota_takes_only_what_fair_share_reclaim_would():
    # b (quota 0) waits with a 2-GPU training over its quota; a (quota 1) borrowed three
    # GPUs of the 4-GPU node. Fair-share reclaim takes a's work above a's fair share for b
    # only while b's pod fits b's own fair share.
    ds, ps = org(("a", 1), ("b", 0))
    wait = make_workload("b1").project("b").gpus(2).submitted(10).obj()
    snap = snapshot([make_node("n1", gpus=4)], ds, ps, [*_pieces("a", 4), wait])
    held, quota = {"a": 4000, "b": 0}, {"a": 1000, "b": 0}
    assert Holdings(snap, held, quota, fair={"a": 2000, "b": 2000}).could_start(wait, 2000)
    # b's fair share is one GPU: its 2-GPU pod is past it, and nothing is taken for it.
    h = Holdings(snap, held, quota, fair={"a": 3000, "b": 1000})
    assert not h.could_start(wait, 2000) and h.hold_causes(wait, 2000) == {CAUSES[6]}
    # a at its fair share: nothing of it is above that share to take.
    h = Holdings(snap, held, quota, fair={"a": 4000, "b": 2000})
    assert not h.could_start(wait, 2000)


def test_a_pod_over_its_quota_catches_up_from_a_project_ahead_over_time():
    # As above with b past its fair share now, but b got far less than its share of
    # over-quota GPUs lately and a far more: catch up takes a's work down to a's quota.
    ds, ps = org(("a", 1), ("b", 0))
    wait = make_workload("b1").project("b").gpus(2).submitted(10).obj()
    snap = snapshot([make_node("n1", gpus=4)], ds, ps, [*_pieces("a", 4), wait])
    held, quota, fair = {"a": 4000, "b": 0}, {"a": 1000, "b": 0}, {"a": 3000, "b": 1000}
    assert not Holdings(snap, held, quota, fair).could_start(wait, 2000)
    gap = 2000 * snap.config.catch_up_s
    snap.over_quota_lag = {("a", "default"): gap, ("b", "default"): -1.0}
    assert Holdings(snap, held, quota, fair).could_start(wait, 2000)
