"""Work that reclaim for another project may not take (placed inside its project's quota, or
not preemptible) keeps off the nodes that alone can hold the pool's biggest pods while another node can take
it, so what runs there stays reclaimable for a pod only they can hold."""

from __future__ import annotations

import numpy as np

from scheduler.cluster import ClusterArrays
from scheduler.core import decide
from scheduler.model import Kind

from .builders import apply, make_node, make_workload, org, snapshot

GIB = 1024


def _nodes():
    # big: the only node with 128 CPUs and 768 GiB; n1, n2: 8 GPUs, 96 CPUs, 384 GiB.
    return [make_node("big", cpu_milli=128_000, mem_mib=768 * GIB),
            make_node("n1", cpu_milli=96_000, mem_mib=384 * GIB),
            make_node("n2", cpu_milli=96_000, mem_mib=384 * GIB)]


def _busy(ask):
    # c (quota 0) borrows seven GPUs of big and four of n1 and all of n2; one GPU is free on
    # big, four on n1: packing alone puts a 1-GPU pod on big.
    ds, ps = org(("a", 4), ("b", 8), ("c", 0))
    running = [make_workload("c-big").project("c").gpus(7).cpu(8000).submitted(1).running(("big", tuple(range(7)), 1000)).obj(),
               make_workload("c-n1").project("c").gpus(4).cpu(8000).submitted(2).running(("n1", (0, 1, 2, 3), 1000)).obj(),
               make_workload("c-n2").project("c").gpus(8).cpu(8000).submitted(3).running(("n2", tuple(range(8)), 1000)).obj()]
    for w in running:
        w.over_quota = True
    return snapshot(_nodes(), ds, ps, [*running, *ask], fair_share_reclaim=False, policy="gpupool")


def _node_of(d, name):
    return next(b.pods[0].node for b in d.binds if b.workload == name)


def test_only_the_nodes_that_alone_hold_the_biggest_pods_are_scarce():
    a = ClusterArrays.from_nodes(_nodes())
    assert a.scarce(None).tolist() == [True, False, False]
    same = ClusterArrays.from_nodes([make_node(f"n{i}") for i in range(3)])
    assert not same.scarce(None).any()  # one node shape: none is scarce
    one_big = ClusterArrays.from_nodes([make_node("n0", gpus=4), make_node("n1", gpus=8), make_node("n2", gpus=4)])
    assert one_big.scarce(None).tolist() == [False, True, False]  # the only node for 8 GPUs
    pools = ClusterArrays.from_nodes([*_nodes(), make_node("f1", pool="fast"), make_node("f2", pool="fast")])
    assert np.flatnonzero(pools.scarce("default")).tolist() == [0]
    assert not pools.scarce("fast").any()


def test_in_quota_work_goes_to_another_node_and_over_quota_work_may_fill_the_scarce_one():
    snap = _busy([make_workload("a1").project("a").gpus(1).cpu(8000).submitted(10).obj(),
                  make_workload("c1").project("c").gpus(1).cpu(8000).submitted(11).obj()])
    d = decide(snap)
    assert _node_of(d, "a1") == "n1"
    assert _node_of(d, "c1") == "big"


def test_work_over_quota_that_cannot_be_preempted_keeps_off_the_scarce_node_too():
    ws = make_workload("c-ws").project("c").kind(Kind.WORKSPACE).gpus(1).cpu(8000).submitted(10).obj()
    ws.allow_over_quota, ws.preemptible = True, False
    d = decide(_busy([ws]))
    assert [(b.workload, b.over_quota) for b in d.binds] == [("c-ws", True)]
    assert _node_of(d, "c-ws") == "n1"


def test_in_quota_work_takes_the_scarce_node_when_no_other_has_room():
    snap = _busy([make_workload("a4").project("a").gpus(4).cpu(8000).submitted(10).obj(),
                  make_workload("a1").project("a").gpus(1).cpu(8000).submitted(11).obj()])
    d = decide(snap)
    assert _node_of(d, "a4") == "n1"
    assert _node_of(d, "a1") == "big"  # n1 is full now: the scarce node rather than a wait


def test_a_pod_only_the_scarce_node_holds_starts_after_one_reclaim():
    # a's in-quota 1-GPU pod kept off big, so when b asks for a whole node with 120 CPUs
    # (only big holds it), big runs only c's borrowed work, which reclaim may take.
    snap = _busy([make_workload("a1").project("a").gpus(1).cpu(8000).submitted(10).obj()])
    apply(snap, decide(snap))
    assert snap.workloads["a1"].placement[0].node == "n1"
    snap.upsert_workload(make_workload("b8").project("b").gpus(8).cpu(120_000, 700 * GIB).submitted(20).obj())
    d = decide(snap)
    assert [e.workload for e in d.evictions] == ["c-big"]
    apply(snap, d)
    d = decide(snap)
    assert _node_of(d, "b8") == "big"


def _nodes_of(d, name):
    return sorted(p.node for b in d.binds if b.workload == name for p in b.pods)


def test_an_in_quota_gang_keeps_off_the_scarce_node_whole():
    # Packing alone puts one of the two pods on big's last free GPU.
    d = decide(_busy([make_workload("ag").project("a").gpus(1).cpu(8000).pods(2).submitted(10).obj()]))
    assert _nodes_of(d, "ag") == ["n1", "n1"]


def test_an_in_quota_gang_takes_the_scarce_node_when_only_with_it_it_fits():
    # Five pods of one GPU: n1 has four free, big one.
    d = decide(_busy([make_workload("ag").project("a").gpus(1).cpu(8000).pods(5).submitted(10).obj()]))
    assert _nodes_of(d, "ag") == ["big", "n1", "n1", "n1", "n1"]


def test_an_over_quota_gang_may_fill_the_scarce_node():
    d = decide(_busy([make_workload("cg").project("c").gpus(1).cpu(8000).pods(2).submitted(10).obj()]))
    assert "big" in _nodes_of(d, "cg")
