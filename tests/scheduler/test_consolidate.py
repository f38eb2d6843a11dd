"""The consolidate action: a pod that needs a whole node while the free GPUs are spread
over many gets a node whose over-quota work can restart elsewhere in the free room now."""

from __future__ import annotations

import dataclasses

import pytest

from scheduler.core import decide
from scheduler.model import EvictionCause, Kind

from .builders import make_node, make_workload, org, snapshot


def _spread(a_quota: float, **cfg):
    # a holds three 1-GPU trainings: n1 GPUs 0-1, n2 GPU 0; five GPUs are free, but no node
    # has four. b (quota 0, no reclaim owed) asks for a 4-GPU training over quota.
    ds, ps = org(("a", a_quota), ("b", 0))
    running = [
        make_workload("a1").project("a").gpus(1).submitted(1).running(("n1", (0,), 1000)).obj(),
        make_workload("a2").project("a").gpus(1).submitted(2).running(("n1", (1,), 1000)).obj(),
        make_workload("a3").project("a").gpus(1).submitted(3).running(("n2", (0,), 1000)).obj(),
    ]
    ask = make_workload("b4").project("b").gpus(4).submitted(10).obj()
    nodes = [make_node("n1", gpus=4), make_node("n2", gpus=4)]
    return snapshot(nodes, ds, ps, [*running, ask], fair_share_reclaim=False, **cfg)


def test_the_node_with_the_fewest_gpus_to_move_is_freed_and_its_work_restarts_elsewhere():
    d = decide(_spread(a_quota=1))
    assert [(e.workload, e.cause) for e in d.evictions] == [("a3", EvictionCause.CONSOLIDATE)]
    assert "restarts on another node" in d.evictions[0].reason
    assert "moving 1 workload to free a whole node" in d.reason("b4")


def test_with_consolidate_in_quota_off_work_inside_its_project_s_quota_is_not_moved():
    # With quota 3, all of a's work is in quota: b4 waits for capacity.
    d = decide(_spread(a_quota=3, consolidate_in_quota=False))
    assert d.evictions == []
    assert "no node in pool default has 4 GPUs free" in d.reason("b4")


def test_a_node_is_opened_with_only_the_work_its_project_holds_over_its_quota():
    # a (quota 4) holds 5 GPUs, 1 over its quota. n1 holds two of a's GPUs, n2 three: on
    # either node a move may take one of them. b asks for 3 whole GPUs: n1, with a1 moved,
    # has 3 (a2 stays), n2 would have 2. a1 restarts on n2's free GPU.
    ds, ps = org(("a", 4), ("b", 0))
    running = [make_workload(f"a{i}").project("a").gpus(1).submitted(i).running((node, (g,), 1000)).obj()
               for i, (node, g) in enumerate([("n1", 0), ("n1", 1), ("n2", 0), ("n2", 1), ("n2", 2)], start=1)]
    ask = make_workload("b3").project("b").gpus(3).submitted(10).obj()
    nodes = [make_node("n1", gpus=4), make_node("n2", gpus=4)]
    # The quota floor holds where the switch is off (on, b3 within its fair share lifts it).
    d = decide(snapshot(nodes, ds, ps, [*running, ask], fair_share_reclaim=False, consolidate_in_quota=False))
    assert [(e.workload, e.cause) for e in d.evictions] == [("a1", EvictionCause.CONSOLIDATE)]
    assert "moving 1 workload to free a whole node" in d.reason("b3")


def test_work_that_just_restarted_is_not_moved_again():
    # a3 restarted 100 s ago (inside resume_protection_s): n1's two pods move instead.
    snap = _spread(a_quota=1)
    snap.upsert_workload(dataclasses.replace(snap.workloads["a3"], resumed=True, started_at=900.0))
    snap.now = 1000.0
    d = decide(snap)
    assert sorted(e.workload for e in d.evictions) == ["a1", "a2"]
    assert {e.cause for e in d.evictions} == {EvictionCause.CONSOLIDATE}


def test_only_nodes_big_enough_for_the_pod_are_opened():
    # b asks for 4 GPUs and 100 CPUs. Five 64-CPU nodes each hold one over-quota GPU of a's
    # (the fewest to move), n6 (128 CPUs) holds two, n7 (64 CPUs) has room for the moved
    # work. Only n6 can ever hold the pod, so n6 is opened, however many smaller nodes
    # would move less.
    ds, ps = org(("a", 0), ("b", 0))
    small = [make_node(f"n{i}", gpus=4, cpu_milli=64_000) for i in range(1, 6)]
    nodes = [*small, make_node("n6", gpus=4, cpu_milli=128_000), make_node("n7", gpus=4, cpu_milli=64_000)]
    running = [make_workload(f"a{i}").project("a").gpus(1).cpu(4000).submitted(i).running((f"n{i}", (0,), 1000)).obj()
               for i in range(1, 6)]
    running += [make_workload(f"a6{g}").project("a").gpus(1).cpu(4000).submitted(6).running(("n6", (g,), 1000)).obj()
                for g in range(2)]
    ask = make_workload("b4").project("b").gpus(4).cpu(100_000).submitted(10).obj()
    d = decide(snapshot(nodes, ds, ps, [*running, ask], fair_share_reclaim=False))
    assert sorted((e.workload, e.cause) for e in d.evictions) == [
        ("a60", EvictionCause.CONSOLIDATE), ("a61", EvictionCause.CONSOLIDATE)]
    assert "moving 2 workloads to free a whole node" in d.reason("b4")


def _spread_in_quota(b_quota: float, *more, **cfg):
    # As _spread, with all of a's work inside a's quota of 3.
    snap = _spread(a_quota=3)
    ds, ps = org(("a", 3), ("b", b_quota))
    work = [*snap.workloads.values(), *more]
    return snapshot(list(snap.nodes.values()), ds, ps, work, fair_share_reclaim=False, **cfg)


def test_with_consolidate_in_quota_work_in_its_quota_moves_for_a_pod_within_its_fair_share():
    # b (quota 3) has a fair share of 4 of the 8 GPUs: its 4-GPU pod is owed them. a's
    # work is all in a's quota; with the switch on, a3 moves to n1 and keeps its GPU.
    d = decide(_spread_in_quota(b_quota=3, consolidate_in_quota=True))
    assert [(e.workload, e.cause) for e in d.evictions] == [("a3", EvictionCause.CONSOLIDATE)]
    assert "moving 1 workload to free a whole node" in d.reason("b4")
    # On is the default (record 0050). Off: work in its quota is never evicted for another project.
    assert [e.workload for e in decide(_spread_in_quota(b_quota=3)).evictions] == ["a3"]
    d = decide(_spread_in_quota(b_quota=3, consolidate_in_quota=False))
    assert d.evictions == []
    assert "no node in pool default has 4 GPUs free" in d.reason("b4")


def test_with_consolidate_in_quota_work_in_its_quota_does_not_move_for_a_pod_past_its_fair_share():
    # b (quota 0) and a both want 4 GPUs over quota (a5 fits no node): of the 5 GPUs over
    # the quotas b's fair share is 2.5, and its 4-GPU pod would borrow beyond it.
    a5 = make_workload("a5").project("a").gpus(4).submitted(5).obj()
    d = decide(_spread_in_quota(0, a5, consolidate_in_quota=True))
    assert d.evictions == []
    assert "no node in pool default has 4 GPUs free" in d.reason("b4")


@pytest.mark.parametrize("kind", [Kind.WORKSPACE, Kind.INFERENCE])
def test_a_workspace_or_an_inference_replica_in_its_quota_is_never_moved(kind):
    # As the move above, but a's work on n2 is a preemptible workspace or inference replica:
    # a move keeps the guarantee only for a training (record 0050), so b4 waits.
    snap = _spread_in_quota(b_quota=3)
    snap.upsert_workload(dataclasses.replace(snap.workloads["a3"], kind=kind, preemptible=True))
    snap.upsert_workload(dataclasses.replace(snap.workloads["a1"], kind=kind, preemptible=True))
    snap.upsert_workload(dataclasses.replace(snap.workloads["a2"], kind=kind, preemptible=True))
    d = decide(snap)
    assert d.evictions == []
    assert "no node in pool default has 4 GPUs free" in d.reason("b4")
