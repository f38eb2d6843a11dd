"""The scheduler core's promises, each on a small hand-made cluster."""

from __future__ import annotations

import copy
import dataclasses

import pytest

from scheduler.core import decide
from scheduler.model import (
    MILLI,
    Department,
    EvictionCause,
    Kind,
    PodDemand,
    Project,
    Quota,
    State,
    ValidationError,
    Workload,
)
from scheduler.snapshot import Snapshot
from scheduler.working import Working

from .builders import apply, make_node, make_workload, org, snapshot


def bound(decisions) -> dict[str, tuple]:
    return {b.workload: b.pods for b in decisions.binds}


def gpus_of(snap: Snapshot, project: str) -> float:
    return sum(v for (p, _), v in snap.usage.items() if p == project) / MILLI


# -- 1. guaranteed quota -------------------------------------------------------------------

def test_in_quota_work_is_placed_before_over_quota_work():
    ds, ps = org(("a", 2), ("b", 2))
    # b's over-quota job was submitted first, yet a's in-quota job gets the GPUs.
    ws = [
        make_workload("b-over").project("b").gpus(3).submitted(0).obj(),
        make_workload("a-in").project("a").gpus(2).submitted(5).obj(),
    ]
    d = decide(snapshot([make_node("n1", gpus=4)], ds, ps, ws))
    assert set(bound(d)) == {"a-in"}
    assert "b-over" in {p.workload for p in d.pending}


def test_in_quota_work_is_never_evicted_for_another_project():
    ds, ps = org(("a", 2), ("b", 2))
    running = [
        make_workload("a1").project("a").gpus(2).preemptible(False).running(("n1", (0, 1), 1000)).obj(),
        make_workload("b1").project("b").gpus(2).running(("n1", (2, 3), 1000)).obj(),
    ]
    pending = [make_workload("a2").project("a").gpus(1).priority(200).obj()]
    d = decide(snapshot([make_node("n1", gpus=4)], ds, ps, running + pending))
    assert d.evictions == []
    assert d.reason("a2") == "no node in pool default has 1 GPU free; 0 workloads ahead"


# -- 2. over quota -------------------------------------------------------------------------

def test_idle_gpus_divided_by_over_quota_weight():
    ds, ps = org(("a", 1), ("b", 1), ("idle", 2), weights={"a": 3, "b": 1})
    ws = [make_workload(f"{p}{i}").project(p).gpus(1).submitted(i).obj() for p in "ab" for i in range(8)]
    d = decide(snapshot([make_node("n1", gpus=8)], ds, ps, ws))
    got = {p: sum(1 for b in d.binds if b.workload.startswith(p)) for p in "ab"}
    # 8 GPUs: 1 + 1 guaranteed, 6 idle split 3:1 -> a 1+4.5, b 1+1.5; whole GPUs: 5 and 2 (+1 leftover)
    assert got["a"] + got["b"] == 8
    assert got["a"] >= 5 and got["b"] >= 2
    assert d.fair_share_milli[("a", "default")] == 5500
    assert d.fair_share_milli[("b", "default")] == 2500


def test_department_quota_caps_its_projects_fair_share():
    d1 = Department("d1", {"default": Quota(2, 1.0, 2)})
    d2 = Department("d2", {"default": Quota(2, 1.0)})
    ps = [Project("a", "d1", {"default": Quota(2)}), Project("b", "d2", {"default": Quota(2)})]
    ws = [make_workload(f"{p}{i}").project(p).gpus(1).submitted(i).obj() for p in "ab" for i in range(6)]
    d = decide(snapshot([make_node("n1", gpus=8)], [d1, d2], ps, ws))
    got = {p: sum(1 for b in d.binds if b.workload.startswith(p)) for p in "ab"}
    assert got["a"] == 2  # the department's limit caps it though 4 GPUs sit idle
    assert got["b"] == 6
    assert "department d1 is at its limit 2 GPUs" in d.reason("a2")


def test_limit_caps_project_even_when_gpus_idle():
    ds, ps = org(("a", 1), limits={"a": 2})
    ws = [make_workload(f"a{i}").project("a").gpus(1).submitted(i).obj() for i in range(4)]
    d = decide(snapshot([make_node("n1", gpus=8)], ds, ps, ws))
    assert len(d.binds) == 2
    assert d.reason("a2") == "project a is at its limit 2 GPUs"


def test_workspace_does_not_go_over_quota_unless_opted_in():
    ds, ps = org(("vision", 4), ("other", 4))
    ws = [
        make_workload("ws1").project("vision").kind(Kind.WORKSPACE).gpus(4).obj(),
        make_workload("ws2").project("vision").kind(Kind.WORKSPACE).gpus(1).submitted(1).obj(),
        make_workload("ws3").project("vision").kind(Kind.WORKSPACE).gpus(1).submitted(2).over_quota().obj(),
    ]
    d = decide(snapshot([make_node("n1", gpus=8)], ds, ps, ws))
    assert set(bound(d)) == {"ws1", "ws3"}
    assert d.reason("ws2") == "project vision is at its quota 4/4 GPUs of guaranteed work and over-quota is off for workspaces"


def test_inference_never_goes_over_quota():
    ds, ps = org(("a", 0.5), ("b", 4))
    w = make_workload("inf").project("a").kind(Kind.INFERENCE).gpus(1).over_quota().obj()
    d = decide(snapshot([make_node("n1", gpus=2)], ds, ps, [w]))
    assert d.binds == [] and "over-quota is off for inferences" in d.reason("inf")


def one_gpu_pods(prefix: str, project: str, n: int, first_gpu: int = 0, kind: Kind = Kind.TRAINING) -> list[Workload]:
    """``n`` running 1-GPU pods of ``project`` on GPUs first_gpu.. of node n1, submitted in order."""
    return [make_workload(f"{prefix}{i}").project(project).kind(kind).gpus(1).submitted(i)
            .running(("n1", (first_gpu + i,), 1000)).obj() for i in range(n)]


def test_borrowed_gpus_do_not_count_against_guaranteed_work():
    # a's training borrowed b's idle GPUs (6 of 8 on a quota of 2); a's inference and
    # workspace are still inside a's quota of guaranteed work: they start in the idle GPUs
    # at once, as in Run:ai, where only non-preemptible GPUs count against such work.
    ds, ps = org(("a", 2), ("b", 6))
    n = make_node("n1", gpus=8)
    running = one_gpu_pods("t", "a", 6)
    pending = [
        make_workload("inf").project("a").kind(Kind.INFERENCE).gpus(1).obj(),
        make_workload("ws").project("a").kind(Kind.WORKSPACE).gpus(1).submitted(1).obj(),
        make_workload("ws-more").project("a").kind(Kind.WORKSPACE).gpus(1).submitted(2).obj(),
    ]
    snap = snapshot([n], ds, ps, running + pending)
    d = decide(snap)
    assert set(bound(d)) == {"inf", "ws"} and not d.evictions
    assert not any(b.over_quota for b in d.binds)
    apply(snap, d)  # now 2 GPUs of guaranteed work: the quota is spent
    d = decide(snap)
    assert d.reason("ws-more") == "project a is at its quota 2/2 GPUs of guaranteed work and over-quota is off for workspaces"


def test_guaranteed_work_preempts_its_own_borrowed_gpus_not_another_projects():
    # The cluster is full: a and b both hold 4 GPUs on quotas of 2 (training; c is idle).
    # a's inference (in quota by guaranteed work) takes the room from a's own borrowed
    # GPUs: nothing is reclaimed from b for a while a's own training holds a's quota.
    ds, ps = org(("a", 2), ("b", 2), ("c", 4))
    n = make_node("n1", gpus=8)
    running = one_gpu_pods("t", "a", 4) + one_gpu_pods("b", "b", 4, first_gpu=4)
    inf = make_workload("inf").project("a").kind(Kind.INFERENCE).gpus(1).submitted(10).obj()
    d = decide(snapshot([n], ds, ps, running + [inf]))
    assert [e.workload for e in d.evictions] == ["t3"]  # a's lowest priority, most recent
    assert d.evictions[0].reason.startswith("preempted by higher-priority workload inf")
    assert d.evictions[0].cause == EvictionCause.PREEMPT


def test_department_quota_counts_a_projects_guaranteed_work_only_for_its_guaranteed_work():
    # Department d (quota 3) holds a (quota 2) and b (quota 2). b's 2 GPUs of workspaces and
    # a's 4 GPUs of training fill d's in-quota count; a's first inference still fits d's
    # guarantee (a holds none of it with work that cannot give way), the second does not.
    ds, ps = org(("a", 2), ("b", 2), ("c", 3), dept_quota=3)
    ds.append(Department("other"))
    ps[2] = Project("c", "other", {"default": Quota(3)})
    n = make_node("n1", gpus=8)
    running = one_gpu_pods("t", "a", 4) + one_gpu_pods("w", "b", 2, first_gpu=4, kind=Kind.WORKSPACE)
    pending = [make_workload(f"inf{i}").project("a").kind(Kind.INFERENCE).gpus(1).submitted(i).obj() for i in range(2)]
    d = decide(snapshot([n], ds, ps, running + pending))
    assert set(bound(d)) == {"inf0"}
    assert d.reason("inf1") == "department d is at its quota 3/3 GPUs of guaranteed work and over-quota is off for inferences"


def test_idle_gpus_go_to_the_least_served_projects_guaranteed_work_first():
    # a holds 2 GPUs over its quota, b 1; one GPU is idle. Both projects' workspaces are
    # in quota by guaranteed work but over it counting everything: the idle GPU is
    # over-quota capacity, so b (less served) gets it although a asked first, and a's
    # workspace takes the GPU of a's own training instead.
    ds, ps = org(("a", 2), ("b", 2), ("c", 3))
    n = make_node("n1", gpus=8)
    running = one_gpu_pods("a", "a", 4) + one_gpu_pods("b", "b", 3, first_gpu=4)
    pending = [make_workload("ws-a").project("a").kind(Kind.WORKSPACE).gpus(1).submitted(10).obj(),
               make_workload("ws-b").project("b").kind(Kind.WORKSPACE).gpus(1).submitted(11).obj()]
    d = decide(snapshot([n], ds, ps, running + pending))
    assert set(bound(d)) == {"ws-b"}
    assert [e.workload for e in d.evictions] == ["a3"] and "ws-a" in d.evictions[0].reason


def test_guaranteed_work_stays_within_the_limit_counting_every_gpu():
    # a: quota 1, limit 1, its training holds the 1 GPU. The workspace is inside a's quota
    # of guaranteed work but a second GPU would pass the limit: it takes the training's GPU
    # (preempted, priority 50 < 100), never an idle one.
    ds, ps = org(("a", 1), ("b", 3), limits={"a": 1})
    n = make_node("n1", gpus=4)
    t = make_workload("t").project("a").gpus(1).running(("n1", (0,), 1000)).obj()
    ws = make_workload("ws").project("a").kind(Kind.WORKSPACE).gpus(1).submitted(1).obj()
    d = decide(snapshot([n], ds, ps, [t, ws]))
    assert d.binds == [] and [e.workload for e in d.evictions] == ["t"]
    d = decide(snapshot([n], ds, ps, [t, ws], preempt=False))
    assert d.evictions == [] and d.reason("ws") == "project a is at its limit 1 GPUs"


def test_work_that_may_not_go_over_quota_still_counts_against_guaranteed_work():
    # Training kept inside its quota (static silos: allow_over_quota false) cannot give way
    # as borrowed GPUs do: it counts, and the inference waits.
    ds, ps = org(("a", 2), ("b", 6))
    n = make_node("n1", gpus=8)
    running = [make_workload(f"t{i}").project("a").gpus(1).over_quota(False).running(("n1", (i,), 1000)).obj() for i in range(2)]
    inf = make_workload("inf").project("a").kind(Kind.INFERENCE).gpus(1).obj()
    d = decide(snapshot([n], ds, ps, running + [inf], preempt=False))
    assert d.binds == [] and d.reason("inf").startswith("project a is at its quota 2/2 GPUs of guaranteed work")


# -- 3. reclaim ----------------------------------------------------------------------------

def test_reclaim_evicts_over_quota_work_of_project_furthest_above_fair_share():
    ds, ps = org(("a", 4), ("b", 2), ("c", 2))
    n = make_node("n1", gpus=8)
    running = [
        # b holds 5 (3 over), c holds 3 (1 over): b is furthest above its share.
        *[make_workload(f"b{i}").project("b").gpus(1).submitted(i).running(("n1", (i,), 1000)).obj() for i in range(5)],
        *[make_workload(f"c{i}").project("c").gpus(1).submitted(i).running(("n1", (5 + i,), 1000)).obj() for i in range(3)],
    ]
    pending = [make_workload("a1").project("a").gpus(2).submitted(100).obj()]
    d = decide(snapshot([n], ds, ps, running + pending))
    assert sorted(e.workload for e in d.evictions) == ["b3", "b4"]  # most recent first
    assert all(e.grace_period_s == 60 for e in d.evictions)
    assert "below its quota" in d.evictions[0].reason
    assert all(e.cause == EvictionCause.RECLAIM for e in d.evictions)
    assert "reclaiming GPUs from 2 workloads of project b" in d.reason("a1")


def test_every_action_and_every_way_of_making_room_is_timed():
    from scheduler.actions import ACTIONS
    from scheduler.actions.evictions import EVICTIONS

    ds, ps = org(("a", 4), ("b", 2))
    running = [make_workload(f"b{i}").project("b").gpus(1).submitted(i).running(("n1", (i,), 1000)).obj() for i in range(8)]
    pending = [make_workload("a1").project("a").gpus(2).submitted(100).obj()]
    d = decide(snapshot([make_node("n1", gpus=8)], ds, ps, running + pending))
    assert [e.cause for e in d.evictions] == [EvictionCause.RECLAIM] * 2
    actions = {f"{a.name}_s" for a in ACTIONS}
    ways = {f"make_room.{e.name}_s" for e in EVICTIONS}
    assert len(actions) == len(ACTIONS) and len(ways) == len(EVICTIONS)  # one name each
    assert set(d.timings) == {"snapshot_s", "actions_s"} | actions | ways
    assert d.timings["make_room.quota_reclaim_s"] > 0  # the reclaim that evicted was timed


def _spread_b(nodes: int = 4, gpus: int = 4):
    """b's one-GPU pods on every GPU; the most recent (first in eviction order) one per node."""
    return [make_workload(f"b-n{k}-g{g}").project("b").gpus(1).submitted(g * nodes + k)
            .running((f"n{k}", (g,), 1000)).obj() for k in range(nodes) for g in range(gpus)]


def test_fair_share_reclaim_clears_one_node_when_the_eviction_order_is_spread_over_many():
    # Both projects have quota 0 and equal weights; b holds all 16 GPUs, a wants one 4-GPU
    # pod: its fair share is 4, b's 12. The first max_victim_scan candidates free one GPU on
    # each node, which is no room; the per-node plan takes the four pods of one node
    # (fewest evictions, then the lowest index), leaving b at its fair share.
    ds, ps = org(("a", 0), ("b", 0))
    nodes = [make_node(f"n{k}", gpus=4) for k in range(4)]
    pending = [make_workload("a1").project("a").gpus(4).submitted(100).obj()]
    d = decide(snapshot(nodes, ds, ps, _spread_b() + pending, max_victim_scan=4))
    assert sorted(e.workload for e in d.evictions) == [f"b-n0-g{g}" for g in range(4)]
    assert all("below its fair share" in e.reason for e in d.evictions)
    assert all(e.cause == EvictionCause.FAIR_SHARE for e in d.evictions)
    assert "reclaiming GPUs from 4 workloads of project b" in d.reason("a1")


def test_fair_share_node_plan_keeps_the_victims_fair_share():
    # a's fair share is 3 (weights 3:13), so b must keep 13: three of one node's pods go for
    # a 3-GPU pod.
    ds, ps = org(("a", 0), ("b", 0), weights={"a": 3, "b": 13})
    nodes = [make_node(f"n{k}", gpus=4) for k in range(4)]
    pending = [make_workload("a1").project("a").gpus(3).submitted(100).obj()]
    d = decide(snapshot(nodes, ds, ps, _spread_b() + pending, max_victim_scan=4))
    assert sorted(e.workload for e in d.evictions) == [f"b-n0-g{g}" for g in range(1, 4)]


def test_quota_reclaim_clears_one_node_for_a_whole_node_pod():
    # a is below its quota (8) with a 4-GPU pod; b holds all 16 GPUs, 8 over its quota. The
    # global eviction order frees one GPU per node; the per-node plan takes one node's pods.
    ds, ps = org(("a", 8), ("b", 8))
    nodes = [make_node(f"n{k}", gpus=4) for k in range(4)]
    pending = [make_workload("a1").project("a").gpus(4).submitted(100).obj()]
    d = decide(snapshot(nodes, ds, ps, _spread_b() + pending, max_victim_scan=4))
    assert sorted(e.workload for e in d.evictions) == [f"b-n0-g{g}" for g in range(4)]
    assert all("below its quota" in e.reason for e in d.evictions)


def test_quota_reclaim_node_plan_passes_over_work_that_just_restarted():
    # As above, but n0's pods restarted after a preemption 100 s ago (protected for 600 s):
    # the plan clears n1 instead, and no thrash.
    ds, ps = org(("a", 8), ("b", 8))
    nodes = [make_node(f"n{k}", gpus=4) for k in range(4)]
    spread = [dataclasses.replace(w, resumed=True, started_at=900.0) if w.name.startswith("b-n0-") else w
              for w in _spread_b()]
    pending = [make_workload("a1").project("a").gpus(4).submitted(100).obj()]
    snap = snapshot(nodes, ds, ps, spread + pending, max_victim_scan=4)
    snap.now = 1000.0
    d = decide(snap)
    assert sorted(e.workload for e in d.evictions) == [f"b-n1-g{g}" for g in range(4)]


def _nlp_borrows_a_gang(gang_pods: int = 2, gpus_per_pod: int = 1):
    """The defect found on a live hub: nlp (quota 1) runs a 0.25 workspace in quota and a
    gang over quota; vision (quota 2) uses 0.75 and asks for a 1-GPU workspace."""
    ds, ps = org(("nlp", 1), ("vision", 2))
    gang = make_workload("big").project("nlp").gpus(gpus_per_pod).pods(gang_pods).submitted(1)
    gang = gang.running(*[("n1", tuple(range(2 + k * gpus_per_pod, 2 + (k + 1) * gpus_per_pod)), 1000)
                          for k in range(gang_pods)]).obj()
    gang.over_quota = True
    running = [
        make_workload("nlp-ws").project("nlp").kind(Kind.WORKSPACE).gpus(0.25).submitted(0).running(("n1", (0,), 250)).obj(),
        make_workload("vision-ws").project("vision").kind(Kind.WORKSPACE).gpus(0.75).submitted(2).running(("n1", (1,), 750)).obj(),
        gang,
    ]
    ask = make_workload("carol").project("vision").kind(Kind.WORKSPACE).gpus(1).submitted(10).obj()
    return ds, ps, running + [ask]


def test_quota_reclaim_takes_an_over_quota_gang_whole_though_its_project_drops_below_quota():
    ds, ps, ws = _nlp_borrows_a_gang()
    d = decide(snapshot([make_node("n1", gpus=4)], ds, ps, ws))
    assert [e.workload for e in d.evictions] == ["big"]
    assert "holds less than its quota" in d.evictions[0].reason
    assert "reclaiming GPUs from 1 workload of project nlp" in d.reason("carol")


def test_quota_reclaim_takes_a_single_multi_gpu_pod_over_quota():
    ds, ps, ws = _nlp_borrows_a_gang(gang_pods=1, gpus_per_pod=2)
    d = decide(snapshot([make_node("n1", gpus=4)], ds, ps, ws))
    assert [e.workload for e in d.evictions] == ["big"]


def test_reclaim_below_quota_spares_work_that_would_fit_back_inside_it():
    # nlp (quota 1.5) holds 0.25 in quota and a 2-GPU gang plus a 1-GPU job over it. Taking
    # the 1-GPU job would leave 1.25 + 1 > 1.5 whole... but taking both leaves 0.25, and the
    # 1-GPU job would then fit back (0.25 + 1 <= 1.5): it would reclaim its way back (thrash).
    ds, ps = org(("nlp", 1.5), ("vision", 2))
    running = [
        make_workload("nlp-ws").project("nlp").kind(Kind.WORKSPACE).gpus(0.25).running(("n1", (0,), 250)).obj(),
        make_workload("gang").project("nlp").gpus(1).pods(2).submitted(1).running(("n1", (1,), 1000), ("n1", (2,), 1000)).obj(),
        make_workload("one").project("nlp").gpus(1).submitted(2).running(("n1", (3,), 1000)).obj(),
    ]
    ask = make_workload("v").project("vision").gpus(2).pods(1).submitted(10).obj()
    d = decide(snapshot([make_node("n1", gpus=4)], ds, ps, running + [ask]))
    # Room for 2 whole GPUs: the gang alone (nlp keeps 1.25, and 1.25 + 2 > 1.5).
    assert [e.workload for e in d.evictions] == ["gang"]


def test_a_project_at_its_quota_loses_nothing_to_reclaim():
    ds, ps = org(("nlp", 2), ("vision", 2))
    running = [make_workload("gang").project("nlp").gpus(1).pods(2).running(("n1", (0,), 1000), ("n1", (1,), 1000)).obj(),
               make_workload("vws").project("vision").kind(Kind.WORKSPACE).gpus(0.5).running(("n1", (2,), 500)).obj(),
               make_workload("vws2").project("vision").kind(Kind.WORKSPACE).gpus(0.5).running(("n1", (3,), 500)).obj()]
    ask = make_workload("v").project("vision").kind(Kind.WORKSPACE).gpus(1).submitted(10).obj()
    d = decide(snapshot([make_node("n1", gpus=4)], ds, ps, running + [ask]))
    assert d.evictions == []


def test_reclaim_never_evicts_non_preemptible_work():
    ds, ps = org(("a", 4), ("b", 2))
    running = [make_workload(f"b{i}").project("b").kind(Kind.WORKSPACE).over_quota().gpus(1)
               .running(("n1", (i,), 1000)).obj() for i in range(4)]
    pending = [make_workload("a1").project("a").gpus(2).obj()]
    d = decide(snapshot([make_node("n1", gpus=4)], ds, ps, running + pending))
    assert d.evictions == []
    assert "no node in pool default has 2 GPUs free" in d.reason("a1")


def test_reclaim_picks_lowest_priority_and_fewest_evictions():
    ds, ps = org(("a", 2), ("b", 0))
    running = [
        make_workload("b-big").project("b").gpus(2).priority(10).submitted(0).running(("n1", (0, 1), 1000)).obj(),
        make_workload("b-hi").project("b").gpus(1).priority(90).submitted(5).running(("n1", (2,), 1000)).obj(),
        make_workload("b-lo").project("b").gpus(1).priority(5).submitted(1).running(("n1", (3,), 1000)).obj(),
    ]
    pending = [make_workload("a1").project("a").gpus(2).obj()]
    d = decide(snapshot([make_node("n1", gpus=4)], ds, ps, running + pending))
    # b-lo goes first (lowest priority) but does not make room alone; b-big does, so b-lo is spared.
    assert [e.workload for e in d.evictions] == ["b-big"]


def test_reclaimed_work_waits_for_release_without_more_evictions():
    ds, ps = org(("a", 2), ("b", 0))
    running = [make_workload(f"b{i}").project("b").gpus(1).submitted(i).running(("n1", (i,), 1000)).obj()
               for i in range(4)]
    snap = snapshot([make_node("n1", gpus=4)], ds, ps, running + [make_workload("a1").project("a").gpus(2).obj()])
    d1 = decide(snap)
    assert len(d1.evictions) == 2
    apply(snap, d1, release_evicted=False)  # victims still exiting
    d2 = decide(snap)
    assert d2.evictions == [] and d2.binds == []
    assert "waiting for 2 evicted workloads to release GPUs" == d2.reason("a1")
    for e in d1.evictions:
        snap.remove_workload(e.workload)
    d3 = decide(snap)
    assert set(bound(d3)) == {"a1"}


def test_no_thrashing_over_many_cycles():
    """Two projects, both wanting everything: evictions settle, they never ping-pong."""
    ds, ps = org(("a", 4), ("b", 4))
    nodes = [make_node("n1", gpus=4), make_node("n2", gpus=4)]
    ws = [make_workload(f"{p}{i}").project(p).gpus(1).submitted(t).obj()
          for t, (p, i) in enumerate((p, i) for i in range(12) for p in "ab")]
    # a arrives first and takes everything; b arrives later and reclaims.
    snap = snapshot(nodes, ds, ps, [w for w in ws if w.project == "a"])
    apply(snap, decide(snap))
    for w in ws:
        if w.project == "b":
            snap.upsert_workload(w)
    evictions_per_cycle = []
    evicted_names = []
    for _ in range(30):
        d = decide(snap)
        evictions_per_cycle.append(len(d.evictions))
        evicted_names += [e.workload for e in d.evictions]
        apply(snap, d)
    assert gpus_of(snap, "a") == 4 and gpus_of(snap, "b") == 4
    assert sum(evictions_per_cycle[3:]) == 0
    assert all(n.startswith("a") for n in evicted_names)  # b never evicts back


# -- 4. preempt within a project -----------------------------------------------------------

def test_higher_priority_displaces_lower_priority_in_same_project():
    ds, ps = org(("a", 4), ("b", 4))
    running = [
        make_workload("a-lo").project("a").gpus(2).priority(10).running(("n1", (0, 1), 1000)).obj(),
        make_workload("a-mid").project("a").gpus(2).priority(40).running(("n1", (2, 3), 1000)).obj(),
        make_workload("b-lo").project("b").gpus(4).priority(1).preemptible(False)
        .running(("n2", (0, 1, 2, 3), 1000)).obj(),
    ]
    pending = [make_workload("a-hi").project("a").gpus(2).priority(90).obj()]
    d = decide(snapshot([make_node("n1", gpus=4), make_node("n2", gpus=4)], ds, ps, running + pending))
    assert [e.workload for e in d.evictions] == ["a-lo"]
    assert "preempted by higher-priority workload a-hi" in d.evictions[0].reason


def test_equal_priority_does_not_preempt():
    ds, ps = org(("a", 2))
    running = [make_workload("a1").project("a").gpus(2).priority(50).running(("n1", (0, 1), 1000)).obj()]
    d = decide(snapshot([make_node("n1", gpus=2)], ds, ps, running + [make_workload("a2").project("a").gpus(2).obj()]))
    assert d.evictions == []


# -- 5. gangs ------------------------------------------------------------------------------

def test_gang_placed_whole_or_not_at_all():
    ds, ps = org(("a", 16))
    nodes = [make_node("n1", gpus=4), make_node("n2", gpus=4), make_node("n3", gpus=4)]
    ws = [make_workload("busy").project("a").gpus(4).preemptible(False).running(("n3", (0, 1, 2, 3), 1000)).obj(),
          make_workload("big").project("a").gpus(2).pods(5).obj(),  # 10 GPUs > 8 free: none
          make_workload("ok").project("a").gpus(2).pods(4).submitted(1).obj()]
    snap = snapshot(nodes, ds, ps, ws)
    before = snap.arrays.gpu_free.copy()
    d = decide(snap)
    assert set(bound(d)) == {"ok"} and len(bound(d)["ok"]) == 4
    assert "room for the whole gang of 5 pods x 2 GPUs" in d.reason("big")
    assert (snap.arrays.gpu_free == before).all()  # decide never touches the snapshot


def test_gang_prefers_one_topology_domain():
    ds, ps = org(("a", 32))
    nodes = [make_node(f"n{r}{i}", gpus=4, rack=f"r{r}") for r in range(2) for i in range(2)]
    running = [make_workload("x").project("a").gpus(1).running(("n00", (0,), 1000)).obj()]
    gang = make_workload("g").project("a").gpus(4).pods(2).topology("rack").obj()
    d = decide(snapshot(nodes, ds, ps, running + [gang]))
    racks = {p.node[:2] for p in bound(d)["g"]}
    assert racks == {"n1"}  # rack r1 is the only one that holds both pods


def test_gang_larger_than_cluster_is_a_validation_error():
    ds, ps = org(("a", 4))
    snap = snapshot([make_node("n1", gpus=4)], ds, ps)
    with pytest.raises(ValidationError) as e:
        snap.upsert_workload(make_workload("g").project("a").gpus(2).pods(3).obj())
    assert e.value.field == "workload[g].pods" and "whole cluster has 4" in str(e.value)


def test_rolled_back_checkpoint_equals_original():
    ds, ps = org(("a", 4))
    snap = snapshot([make_node("n1", gpus=4)], ds, ps)
    work = Working(snap)
    ref = (work.arrays.gpu_free.copy(), work.arrays.full_free.copy(), work.arrays.cpu_free.copy(), dict(work.usage))
    cp = work.checkpoint()
    from scheduler.placement import Choice
    w = make_workload("w").project("a").gpus(0.5).cpu(1000, 10).obj()
    work.take(w, [Choice(0, (1,), 500)])
    work.take(w, [Choice(0, (2,), 500)])
    work.rollback(cp)
    assert (work.arrays.gpu_free == ref[0]).all() and (work.arrays.full_free == ref[1]).all()
    assert (work.arrays.cpu_free == ref[2]).all()
    assert {k: v for k, v in work.usage.items() if v} == {k: v for k, v in ref[3].items() if v}
    ws = make_workload("ws").project("a").kind(Kind.WORKSPACE).gpus(1).obj()
    cp = work.checkpoint()
    work.take(ws, [Choice(0, (3,), 1000)])
    assert work.fixed_usage[("a", "default")] == 1000
    work.rollback(cp)
    assert work.fixed_usage[("a", "default")] == 0


def test_a_trial_is_undone_unless_kept():
    ds, ps = org(("a", 4))
    work = Working(snapshot([make_node("n1", gpus=4)], ds, ps))
    from scheduler.placement import Choice

    def state():
        a = work.arrays
        return (a.gpu_free.tolist(), a.full_free.tolist(), a.cpu_free.tolist(), {k: v for k, v in work.usage.items() if v})

    w = make_workload("w").project("a").gpus(1).obj()
    before = state()
    with work.trial():
        work.take(w, [Choice(0, (0,), 1000)])
        assert state() != before
    assert state() == before
    with pytest.raises(RuntimeError), work.trial():  # an exception undoes it too
        work.take(w, [Choice(0, (0,), 1000)])
        raise RuntimeError
    assert state() == before
    with work.trial() as t:
        work.take(w, [Choice(0, (1,), 1000)])
        kept = state()
        with work.trial() as inner:
            work.take(w, [Choice(0, (2,), 1000)])
            inner.undo()  # back to where the inner trial began, and on
            assert state() == kept
            work.take(w, [Choice(0, (3,), 1000)])
        assert state() == kept  # the inner trial was not kept
        t.keep()
    assert state() == kept != before


# -- 6. fractions --------------------------------------------------------------------------

def test_fractions_share_one_gpu_and_never_exceed_it():
    ds, ps = org(("a", 4))
    ws = [make_workload(f"f{i}").project("a").gpus(0.25).submitted(i).obj() for i in range(4)]
    ws += [make_workload("f-half").project("a").gpus(0.5).submitted(9).obj()]
    snap = snapshot([make_node("n1", gpus=2)], ds, ps, ws)
    d = decide(snap)
    per_gpu: dict = {}
    for b in d.binds:
        (p,) = b.pods
        assert len(p.gpu_indices) == 1
        per_gpu[p.gpu_indices[0]] = per_gpu.get(p.gpu_indices[0], 0) + p.gpu_milli
    assert sorted(per_gpu.values()) == [500, 1000]  # four quarters packed on one GPU
    assert all(v <= 1000 for v in per_gpu.values())


def test_fraction_goes_to_partly_used_gpu_not_a_fresh_one():
    ds, ps = org(("a", 8))
    running = [make_workload("r").project("a").gpus(0.5).running(("n2", (3,), 500)).obj(),
               make_workload("whole").project("a").gpus(1).running(("n1", (0,), 1000)).obj()]
    d = decide(snapshot([make_node("n1", gpus=4), make_node("n2", gpus=4)], ds, ps,
                        running + [make_workload("f").project("a").gpus(0.5).obj()]))
    assert bound(d)["f"][0].node == "n2" and bound(d)["f"][0].gpu_indices == (3,)


def test_gpu_memory_request_fits_by_memory():
    ds, ps = org(("a", 4))
    w = make_workload("m").project("a").gpu_memory(40 * 1024).obj()
    snap = snapshot([make_node("n1", gpus=1, memory_mib=81920)], ds, ps, [w])
    d = decide(snap)
    assert bound(d)["m"][0].gpu_milli == 500


# -- 7. pools, models, CPU and memory --------------------------------------------------------

def test_node_pool_model_and_cpu_constraints():
    ds, ps = org(("a", 16), pool="default")
    ps[0].quotas["a100"] = Quota(8)
    nodes = [make_node("h", gpus=4, model="H100"),
             make_node("a", gpus=4, model="A100", pool="a100"),
             make_node("small", gpus=4, model="H100", cpu_milli=2000)]
    ws = [
        make_workload("pool").project("a").gpus(1).pool("a100").obj(),
        make_workload("model").project("a").gpus(1).models("H100").cpu(8000).obj(),
        make_workload("cpu").project("a").gpus(1).models("H100").cpu(200_000).submitted(2).obj(),
    ]
    d = decide(snapshot(nodes, ds, ps, ws))
    assert bound(d)["pool"][0].node == "a"
    assert bound(d)["model"][0].node == "h"
    assert "no node in pool default with GPU model H100 has 200 CPU" in d.reason("cpu")


def test_unknown_pool_and_project_are_reasons_not_crashes():
    ds, ps = org(("a", 1))
    ws = [make_workload("p").project("a").gpus(1).pool("nope").obj(),
          make_workload("q").project("ghost").gpus(1).obj()]
    d = decide(snapshot([make_node("n1", gpus=1)], ds, ps, ws))
    assert d.reason("p") == "node pool nope does not exist"
    assert d.reason("q") == "project ghost does not exist"


# -- 8. reasons and positions ----------------------------------------------------------------

def test_every_waiting_workload_has_reason_and_position():
    ds, ps = org(("a", 8))
    ws = [make_workload(f"w{i}").project("a").gpus(1).submitted(i).obj() for i in range(6)]
    d = decide(snapshot([make_node("n1", gpus=2)], ds, ps, ws))
    assert [p.workload for p in d.pending] == ["w2", "w3", "w4", "w5"]
    assert [p.queue_position for p in d.pending] == [1, 2, 3, 4]
    assert d.reason("w4") == "no node in pool default has 1 GPU free; 2 workloads ahead"


# -- validation ----------------------------------------------------------------------------

@pytest.mark.parametrize(
    "demand, field",
    [
        (PodDemand(gpu_fraction=-0.5), "gpu_fraction"),
        (PodDemand(gpu_fraction=1.5), "gpu_fraction"),
        (PodDemand(gpus=-1), "gpus"),
        (PodDemand(gpus=1, gpu_fraction=0.5), "demand"),
        (PodDemand(cpu_milli=-1), "cpu_milli"),
    ],
    ids=["negative-fraction", "fraction-above-one", "negative-gpus", "two-forms", "negative-cpu"],
)
def test_bad_demand_names_the_field(demand, field):
    with pytest.raises(ValidationError) as e:
        Workload("w", "a", demand=demand).validate()
    assert field in e.value.field


def test_bad_quota_and_orphan_project_are_rejected():
    snap = Snapshot()
    snap.set_department(Department("d"))
    with pytest.raises(ValidationError, match=r"project\[p\]\.quotas\[default\]\.gpus"):
        snap.set_project(Project("p", "d", {"default": Quota(-1)}))
    with pytest.raises(ValidationError, match="department 'nowhere' does not exist"):
        snap.set_project(Project("q", "nowhere"))
    with pytest.raises(ValidationError, match="limit"):
        snap.set_project(Project("r", "d", {"default": Quota(4, 1, 2)}))


def test_decide_is_deterministic_and_pure():
    ds, ps = org(("a", 3), ("b", 1))
    ws = [make_workload(f"{p}{i}").project(p).gpus(0.5 if i % 2 else 1).submitted(i).obj()
          for p in "ab" for i in range(7)]
    snap = snapshot([make_node("n1", gpus=4), make_node("n2", gpus=4)], ds, ps, ws)
    before = copy.deepcopy((snap.usage, snap.workloads))
    d1, d2 = decide(snap), decide(snap)
    assert (d1.binds, d1.evictions, d1.pending) == (d2.binds, d2.evictions, d2.pending)
    assert (snap.usage, snap.workloads) == before


def test_snapshot_updates_incrementally():
    ds, ps = org(("a", 4))
    snap = snapshot([make_node("n1", gpus=2)], ds, ps)
    w = make_workload("w").project("a").gpus(0.5).obj()
    snap.upsert_workload(dataclasses.replace(w, state=State.RUNNING, placement=()) if False else w)
    apply(snap, decide(snap))
    assert snap.usage[("a", "default")] == 500 and snap.arrays.gpu_free.min() == 500
    snap.remove_workload("w")
    assert snap.usage[("a", "default")] == 0 and snap.arrays.gpu_free.min() == 1000
    # what guaranteed work holds is kept beside it, and only that (training gives way)
    ws = make_workload("ws").project("a").kind(Kind.WORKSPACE).gpus(1).obj()
    snap.upsert_workload(ws)
    snap.upsert_workload(make_workload("t").project("a").gpus(1).submitted(1).obj())
    apply(snap, decide(snap))
    assert snap.usage[("a", "default")] == 2000 and snap.fixed_usage[("a", "default")] == 1000
    ws.state, ws.placement = State.PENDING, ()  # changed in place, as adapters do
    snap.upsert_workload(ws)
    assert snap.usage[("a", "default")] == 1000 and snap.fixed_usage[("a", "default")] == 0


def test_snapshot_survives_adapters_changing_workloads_in_place():
    """Adapters may flip a stored object's state and upsert it again; the snapshot must
    undo exactly what it filed, or a releasing workload would stay a victim."""
    ds, ps = org(("a", 0), ("b", 2))
    w = make_workload("a1").project("a").gpus(2).running(("n1", (0, 1), 1000)).obj()
    snap = snapshot([make_node("n1", gpus=2)], ds, ps, [w])
    _ = snap.arrays
    w.state = State.RELEASING
    snap.upsert_workload(w)
    assert snap.victims["a"] == []
    assert snap.usage[("a", "default")] == 2000 and snap.arrays.full_free[0] == 0
    snap.upsert_workload(make_workload("b1").project("b").gpus(2).obj())
    d = decide(snap)
    assert d.evictions == [] and "waiting for 1 evicted workload" in d.reason("b1")
    w.state, w.placement = State.PENDING, ()
    snap.upsert_workload(w)
    assert snap.usage[("a", "default")] == 0 and snap.arrays.full_free[0] == 2


def test_resumed_work_goes_first_in_queue_but_never_preempts_for_it():
    ds, ps = org(("a", 2))
    running = [make_workload("peer").project("a").gpus(2).running(("n1", (0, 1), 1000)).obj()]
    back = make_workload("back").project("a").gpus(2).submitted(10).obj()
    back.resumed = True
    new = make_workload("new").project("a").gpus(2).submitted(1).obj()
    d = decide(snapshot([make_node("n1", gpus=2)], ds, ps, running + [back, new]))
    assert d.evictions == []  # one step up in the queue, not a priority to preempt with
    assert [p.workload for p in d.pending] == ["back", "new"]


def test_work_restarted_after_preemption_is_protected_for_a_while():
    ds, ps = org(("a", 4))
    victim = make_workload("low").project("a").gpus(2).priority(10).running(("n1", (0, 1), 1000)).obj()
    victim.resumed, victim.started_at = True, 1000.0
    snap = snapshot([make_node("n1", gpus=2)], ds, ps, [victim, make_workload("hi").project("a").gpus(2).priority(90).obj()])
    snap.now = 1000.0 + 599
    assert decide(snap).evictions == []
    snap.now = 1000.0 + 601
    assert [e.workload for e in decide(snap).evictions] == ["low"]


def test_reclaim_takes_other_work_before_and_protected_work_only_after_its_window():
    """A project back under its quota reclaims from work that did not just restart; work
    that restarted within the protection is taken only once the window has passed (taking
    it at once was the replay's only thrash)."""
    ds, ps = org(("a", 2), ("b", 0))
    victim = make_workload("b1").project("b").gpus(2).running(("n1", (0, 1), 1000)).obj()
    victim.resumed, victim.started_at = True, 1000.0
    snap = snapshot([make_node("n1", gpus=2)], ds, ps, [victim, make_workload("a1").project("a").gpus(2).obj()])
    snap.now = 1001.0
    assert decide(snap).evictions == []
    snap.now = 1000.0 + 601
    assert [e.workload for e in decide(snap).evictions] == ["b1"]
    other = make_workload("b2").project("b").gpus(2).running(("n2", (0, 1), 1000)).obj()
    snap = snapshot([make_node("n1", gpus=2), make_node("n2", gpus=2)], ds, ps, [victim, other, make_workload("a1").project("a").gpus(2).obj()])
    snap.now = 1001.0
    assert [e.workload for e in decide(snap).evictions] == ["b2"]


@pytest.mark.parametrize(
    "field_name, value",
    [
        ("max_victim_scan", 0),
        ("max_victim_scan", 2.5),
        ("resume_protection_s", -1),
        ("catch_up_s", float("nan")),
        ("fair_share_half_life_s", 0),
        ("fair_share_half_life_s", "4h"),
        ("fair_share_over_time", "yes"),
    ],
)
def test_scheduler_config_names_the_bad_field(field_name, value):
    from scheduler.snapshot import SchedulerConfig

    with pytest.raises(ValidationError) as e:
        SchedulerConfig(**{field_name: value})
    assert e.value.field == field_name and repr(value) in str(e.value)
    SchedulerConfig(resume_protection_s=0, catch_up_s=0)  # zero windows are allowed
