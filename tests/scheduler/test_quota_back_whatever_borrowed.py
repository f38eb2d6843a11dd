"""A team returning to its quota gets it back, whatever kind of work borrowed it and whoever
holds the node its pod needs (record 0070): reclaim and preemption together where neither
alone makes room; borrowed GPUs are reclaimable whether the borrower is a training or a
workspace; work restarted lately stays (thrash)."""

from __future__ import annotations

import dataclasses

from scheduler.core import decide
from scheduler.model import EvictionCause, Kind, State

from .builders import apply, make_node, make_workload, org, snapshot


def _gpu(name, project, slot, node="n1", **kw):
    b = make_workload(name).project(project).gpus(1).submitted(slot).running((node, (slot,), 1000))
    w = b.obj()
    return dataclasses.replace(w, **kw) if kw else w


def _whole_node_workspace(name="ws", project="c", t=100.0):
    return make_workload(name).project(project).kind(Kind.WORKSPACE).gpus(4).submitted(t).obj()


def test_own_training_and_a_borrowed_gpu_on_the_one_node_both_give_way():
    # c (quota 4) runs a 1-GPU training in its quota on n1; b borrowed n1's other 3 GPUs
    # over its quota (1). c's workspace needs all 4 GPUs of n1 (the only node): reclaim
    # alone leaves c's training there, preemption alone leaves b's GPUs. Together they do.
    ds, ps = org(("b", 0), ("c", 4))
    running = [_gpu("c-train", "c", 0), *(_gpu(f"b{i}", "b", i, over_quota=True) for i in (1, 2, 3))]
    snap = snapshot([make_node("n1", gpus=4)], ds, ps, [*running, _whole_node_workspace()])
    d = decide(snap)
    evicted = {e.workload: e.cause for e in d.evictions}
    assert evicted == {"c-train": EvictionCause.PREEMPT, "b1": EvictionCause.RECLAIM,
                       "b2": EvictionCause.RECLAIM, "b3": EvictionCause.RECLAIM}
    assert not d.binds  # it binds once its victims are gone
    apply(snap, d)
    d = decide(snap)
    assert [b.workload for b in d.binds][:1] == ["ws"]


def test_the_fewest_victims_on_the_node_that_needs_the_fewest():
    # Two nodes: on n1 c's training sits beside 3 borrowed GPUs; on n2 c's training sits
    # beside 2 borrowed GPUs and one free. n2 needs 3 evictions, n1 would need 4.
    ds, ps = org(("b", 0), ("c", 8))
    running = [_gpu("c-t1", "c", 0), *(_gpu(f"b{i}", "b", i, over_quota=True) for i in (1, 2, 3)),
               _gpu("c-t2", "c", 0, node="n2"), _gpu("b5", "b", 1, node="n2", over_quota=True),
               _gpu("b6", "b", 2, node="n2", over_quota=True)]
    nodes = [make_node("n1", gpus=4), make_node("n2", gpus=4)]
    d = decide(snapshot(nodes, ds, ps, [*running, _whole_node_workspace()]))
    assert sorted(e.workload for e in d.evictions) == ["b5", "b6", "c-t2"]


def test_work_restarted_lately_is_not_taken_together_either():
    # As the first case, but c's training restarted after an eviction 60 s ago: taking it
    # again would be thrash, so nothing is evicted and the workspace waits.
    ds, ps = org(("b", 0), ("c", 4))
    resumed = _gpu("c-train", "c", 0, resumed=True, started_at=940.0)
    running = [resumed, *(_gpu(f"b{i}", "b", i, over_quota=True) for i in (1, 2, 3))]
    snap = snapshot([make_node("n1", gpus=4)], ds, ps, [*running, _whole_node_workspace()])
    snap.now = 1000.0
    d = decide(snap)
    assert not d.evictions
    assert not d.binds


def test_higher_priority_own_work_is_not_preempted_for_it():
    # c's work beside b's borrowed GPUs is an inference service (above a workspace's
    # priority): it stays, and no plan evicts b's GPUs for nothing.
    ds, ps = org(("b", 0), ("c", 4))
    inf = dataclasses.replace(_gpu("c-inf", "c", 0), kind=Kind.INFERENCE)
    running = [inf, *(_gpu(f"b{i}", "b", i, over_quota=True) for i in (1, 2, 3))]
    d = decide(snapshot([make_node("n1", gpus=4)], ds, ps, [*running, _whole_node_workspace()]))
    assert not d.evictions


def test_a_workspace_that_borrowed_is_reclaimed_though_not_marked_preemptible():
    # b's workspace opted in to run over quota (but says nothing of preemption): it holds
    # 2 GPUs over b's quota. c returns to its quota of 2 and gets them back.
    ds, ps = org(("b", 0), ("c", 2))
    ws = make_workload("b-ws").project("b").kind(Kind.WORKSPACE).over_quota().gpus(2).submitted(1)
    borrowed = dataclasses.replace(ws.running(("n1", (0, 1), 1000)).obj(), over_quota=True)
    snap = snapshot([make_node("n1", gpus=2)], ds, ps,
                    [borrowed, make_workload("c-t").project("c").gpus(2).submitted(10).obj()])
    d = decide(snap)
    assert [(e.workload, e.cause) for e in d.evictions] == [("b-ws", EvictionCause.RECLAIM)]


def test_a_workspace_in_its_quota_stays():
    # The same workspace placed inside b's quota (2): protected, whatever c asks.
    ds, ps = org(("b", 2), ("c", 0))
    ws = make_workload("b-ws").project("b").kind(Kind.WORKSPACE).over_quota().gpus(2).submitted(1)
    snap = snapshot([make_node("n1", gpus=2)], ds, ps,
                    [ws.running(("n1", (0, 1), 1000)).obj(), make_workload("c-t").project("c").gpus(2).submitted(10).obj()])
    assert not decide(snap).evictions
    assert snap.workloads["b-ws"].state == State.RUNNING


def test_room_coming_free_goes_to_as_many_pods_as_it_holds_and_the_next_makes_its_own():
    # b (quota 0) borrowed both GPUs of n1; one of them is being reclaimed (releasing).
    # c (quota 2) has two 1-GPU pods waiting: the first waits for the GPU coming free, the
    # second does not wait for the same GPU (it would find it taken and evict a grace
    # period later): b's other GPU is reclaimed for it now.
    ds, ps = org(("b", 0), ("c", 2))
    going = dataclasses.replace(_gpu("b0", "b", 0, over_quota=True), state=State.RELEASING)
    running = [going, _gpu("b1", "b", 1, over_quota=True)]
    waiting = [make_workload(f"c{i}").project("c").gpus(1).submitted(10 + i).obj() for i in (1, 2)]
    d = decide(snapshot([make_node("n1", gpus=2)], ds, ps, [*running, *waiting]))
    assert [e.workload for e in d.evictions] == ["b1"]
    why = {p.workload: p.reason for p in d.pending}
    assert why["c1"].startswith("waiting for 1 evicted workload")
    assert why["c2"].startswith("reclaiming GPUs from 1 workload of project b")


def test_over_quota_work_still_waits_for_room_coming_free():
    # The same, with c at its quota of 0: its pods are over quota, and both wait for the
    # GPU coming free rather than reclaim (fair share: b and c are even).
    ds, ps = org(("b", 0), ("c", 0))
    going = dataclasses.replace(_gpu("b0", "b", 0, over_quota=True), state=State.RELEASING)
    waiting = [make_workload(f"c{i}").project("c").gpus(1).submitted(10 + i).obj() for i in (1, 2)]
    d = decide(snapshot([make_node("n1", gpus=1)], ds, ps, [going, *waiting]))
    assert not d.evictions
    assert all(p.reason.startswith("waiting for 1 evicted workload") for p in d.pending)


def test_a_larger_piece_the_rule_allows_alone_is_found_past_a_smaller_one():
    # b (quota 1.2) holds 1.3 GPUs on n1: a 0.3 piece (10 CPUs, evicted first) and a whole
    # GPU (40 CPUs). c's 1-GPU pod needs 50 CPUs; 14 are free. The 0.3 piece alone frees
    # too few CPUs, and after it the rule refuses the whole GPU (b would keep 0, and the
    # 0.3 would fit back in its quota); the whole GPU alone the rule allows (b keeps 0.3,
    # and the GPU would be over its quota if it came back), and it frees enough.
    ds, ps = org(("b", 1.2), ("c", 2.8))
    small = make_workload("b-small").project("b").gpus(0.3).cpu(10_000).submitted(2).running(("n1", (1,), 300)).obj()
    whole = make_workload("b-whole").project("b").gpus(1).cpu(40_000).submitted(1).running(("n1", (2,), 1000)).obj()
    ask = make_workload("c1").project("c").gpus(1).cpu(50_000).submitted(10).obj()
    d = decide(snapshot([make_node("n1", gpus=4, cpu_milli=64_000)], ds, ps, [small, whole, ask]))
    assert [e.workload for e in d.evictions] == ["b-whole"]
