"""The worked examples of docs/explanation/scheduling.md, run through the scheduler core.

Each test is one example as the page tells it; if the core's behaviour changes, the page
has to change with it."""

from __future__ import annotations

from scheduler.core import decide
from scheduler.model import Kind

from .scheduler.builders import apply, make_node, make_workload, org, snapshot


def _bound(d, prefix: str) -> int:
    return sum(1 for b in d.binds if b.workload.startswith(prefix))


def test_guaranteed_a_workspace_past_the_quota_waits_beside_idle_gpus():
    ds, ps = org(("nlp", 2), ("vision", 2))
    ws = [make_workload(f"nlp-ws{i}").project("nlp").kind(Kind.WORKSPACE).gpus(1).submitted(i).obj()
          for i in range(3)]
    d = decide(snapshot([make_node("n1", gpus=4)], ds, ps, ws))
    assert _bound(d, "nlp-ws") == 2
    reason = d.reason("nlp-ws2")
    assert "at its quota 2/2 GPUs" in reason and "over-quota is off for workspaces" in reason


def test_over_quota_idle_gpus_divided_by_weight():
    for weights, want in (({"nlp": 1, "vision": 1}, (4, 4)), ({"nlp": 1, "vision": 3}, (3, 5))):
        ds, ps = org(("nlp", 2), ("vision", 2), weights=weights)
        ws = [make_workload(f"{p}-t{i}").project(p).gpus(1).submitted(i).obj()
              for p in ("nlp", "vision") for i in range(4 if p == "nlp" else 6)]
        d = decide(snapshot([make_node("n1", gpus=8)], ds, ps, ws))
        # each project's quota (2) first, then the 4 idle GPUs by weight: 2 + 2 each, or 1 and 3
        assert d.fair_share_milli[("nlp", "default")] == want[0] * 1000
        assert d.fair_share_milli[("vision", "default")] == want[1] * 1000
        assert (_bound(d, "nlp"), _bound(d, "vision")) == want


def test_preemption_an_inference_service_takes_room_from_its_own_projects_training():
    ds, ps = org(("nlp", 2), ("vision", 2))
    trainings = [make_workload(f"nlp-t{i}").project("nlp").gpus(1).submitted(i).obj() for i in range(2)]
    busy = [make_workload(f"vision-t{i}").project("vision").gpus(1).submitted(i).obj() for i in range(2)]
    snap = snapshot([make_node("n1", gpus=4)], ds, ps, [*trainings, *busy])
    apply(snap, decide(snap))
    snap.upsert_workload(make_workload("nlp-llm").project("nlp").kind(Kind.INFERENCE).gpus(1).submitted(10).obj())
    d = decide(snap)
    assert [e.workload for e in d.evictions] == ["nlp-t1"]  # lowest priority, most recent first


def test_gangs_a_two_worker_gang_waits_rather_than_start_one_worker():
    ds, ps = org(("nlp", 8))  # quota to spare: only the node's room decides
    one_free = make_workload("other").project("nlp").gpus(3).preemptible(False).submitted(0).obj()
    gang = make_workload("gang").project("nlp").gpus(1).pods(2).preemptible(False).submitted(1).obj()
    snap = snapshot([make_node("n1", gpus=4)], ds, ps, [one_free])
    apply(snap, decide(snap))
    snap.upsert_workload(gang)
    d = decide(snap)
    assert not any(b.workload == "gang" for b in d.binds)
    assert "no node in pool default" in d.reason("gang")


def test_reclaim_a_borrowed_gang_is_taken_whole_for_a_team_below_its_quota():
    ds, ps = org(("nlp", 1), ("vision", 2))
    ws = [make_workload("nlp-ws").project("nlp").kind(Kind.WORKSPACE).gpus(0.25).submitted(0).obj(),
          make_workload("vision-ws1").project("vision").kind(Kind.WORKSPACE).gpus(0.75).submitted(1).obj(),
          make_workload("nlp-gang").project("nlp").gpus(1).pods(2).submitted(2).obj()]
    snap = snapshot([make_node("n1", gpus=3)], ds, ps, ws)
    d = decide(snap)
    assert {b.workload for b in d.binds} == {"nlp-ws", "vision-ws1", "nlp-gang"}
    apply(snap, d)
    snap.upsert_workload(make_workload("vision-ws2").project("vision").kind(Kind.WORKSPACE).gpus(1).submitted(10).obj())
    d = decide(snap)
    assert [e.workload for e in d.evictions] == ["nlp-gang"]  # nlp left at 0.25 < 1, and 0.25 + 2 > 1
    apply(snap, d)
    assert [b.workload for b in decide(snap).binds] == ["vision-ws2"]
