"""The snapshot's own bookkeeping: exact undo, and nothing for the cyclic collector to walk."""

from __future__ import annotations

import gc

import pytest

from scheduler.model import Kind, State, ValidationError

from .builders import make_node, make_workload, org, snapshot


def _mixed_work(n: int):
    """Running, releasing and pending work of every kind, gangs and fractions among it."""
    out = []
    for i in range(n):
        b = make_workload(f"w{i}").project("ab"[i % 2]).submitted(i)
        b = b.kind((Kind.TRAINING, Kind.WORKSPACE, Kind.INFERENCE)[i % 3])
        node = f"n{i % 4}"
        if i % 5 == 0:
            out.append(b.gpus(1).pods(2).obj())  # a pending gang
        elif i % 5 == 1:
            out.append(b.gpus(0.25).cpu(500, 1024).running((node, (i % 8,), 250)).obj())
        elif i % 5 == 2:
            w = b.gpus(1).running((node, (i % 8,), 1000)).obj()
            w.state = State.RELEASING
            out.append(w)
        elif i % 5 == 3:
            out.append(b.cpu(1000, 2048).running((node, (), 0)).obj())
        else:
            out.append(b.gpus(2).pods(2).running((node, (0, 1), 1000), (f"n{(i + 1) % 4}", (2, 3), 1000)).obj())
    return out


def test_filing_work_leaves_no_container_for_the_cyclic_collector():
    """A full collection walks every container alive; the snapshot's pause must not grow with
    what it files per workload, only with the adapters' own workload objects."""
    ds, ps = org(("a", 8), ("b", 8))
    snap = snapshot([make_node(f"n{i}") for i in range(4)], ds, ps)
    _ = snap.arrays  # kept up to date from here on, as in a running adapter
    work = _mixed_work(400)
    gc.collect()
    before = len(gc.get_objects())
    for w in work:
        snap.upsert_workload(w)
    for _ in range(3):  # the collector stops tracking a tuple once it has seen its items untracked
        gc.collect()
    # per project a dict and a victim list, per shape a key: a handful, not one per workload
    assert len(gc.get_objects()) - before < 40
    assert not any(gc.is_tracked(rec) for rec in snap._filed.values())


def test_removing_everything_filed_restores_the_empty_snapshot():
    ds, ps = org(("a", 8), ("b", 8))
    snap = snapshot([make_node(f"n{i}") for i in range(4)], ds, ps)
    free = snap.arrays.gpu_free.copy()
    work = _mixed_work(60)
    for w in work:
        snap.upsert_workload(w)
    assert snap.usage[("a", "default")] > 0 and snap.victims["a"] and snap.releasing
    for w in work[::2]:  # changed in place since it was filed, as adapters do
        w.state, w.placement, w.project = State.PENDING, (), "b"
    for w in work:
        snap.remove_workload(w.name)
    assert not any(snap.usage.values()) and not any(snap.fixed_usage.values())
    assert not snap.shape_counts and not any(snap.victims.values()) and not snap.releasing
    assert not any(snap.holding_on.values())
    assert (snap.arrays.gpu_free == free).all()
    # shapes seen again are counted from zero
    snap.upsert_workload(work[1])
    assert sum(snap.shape_counts.values()) == work[1].pods


def test_work_is_found_on_each_node_it_holds_room_on_until_it_moves_or_goes():
    ds, ps = org(("a", 8))
    snap = snapshot([make_node(f"n{i}") for i in range(3)], ds, ps)
    gang = make_workload("g").project("a").gpus(1).pods(2).running(("n0", (0,), 1000), ("n1", (0,), 1000)).obj()
    ws = make_workload("ws").project("a").kind(Kind.WORKSPACE).gpus(0.5).running(("n1", (1,), 500)).obj()
    for w in (gang, ws, make_workload("p").project("a").gpus(1).obj()):
        snap.upsert_workload(w)
    assert {n: set(v) for n, v in snap.holding_on.items() if v} == {"n0": {"g"}, "n1": {"g", "ws"}}
    assert snap.holding_gangs == {"g"} and not snap.holding_resumed
    assert snap.victim_pods("g") == (("n0", (0,), 1000), ("n1", (0,), 1000)) and snap.victim_pods("ws") == ()
    resumed = make_workload("ws").project("a").gpus(0.5).running(("n2", (0,), 500)).obj()
    resumed.resumed = True
    snap.upsert_workload(resumed)
    assert snap.holding_on["n1"] == {"g"} and snap.holding_on["n2"] == {"ws"} and snap.holding_resumed == {"ws"}
    assert snap.victim_pods("ws") == (("n2", (0,), 500),)  # a training now: preemptible
    snap.remove_workload("g")
    snap.upsert_workload(make_workload("ws").project("a").gpus(0.5).obj())  # pending again
    assert not any(snap.holding_on.values()) and not snap.holding_gangs and not snap.holding_resumed


def test_running_work_on_an_unknown_node_is_refused_and_changes_nothing():
    ds, ps = org(("a", 8))
    snap = snapshot([make_node("n1")], ds, ps)
    w = make_workload("w").project("a").gpus(1).running(("n1", (0,), 1000)).obj()
    snap.upsert_workload(w)
    moved = make_workload("w").project("a").gpus(1).running(("gone", (0,), 1000)).obj()
    with pytest.raises(ValidationError) as e:
        snap.upsert_workload(moved)
    assert e.value.field == "workload[w].placement" and "unknown node 'gone'" in e.value.message
    assert snap.workloads["w"] is w and snap.usage[("a", "default")] == 1000
    assert snap.arrays.gpu_free[0, 0] == 0
