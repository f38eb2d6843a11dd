"""Fair share over time: the over-quota lag ledger (quota.OverQuotaLedger) and what the
core does with ``Snapshot.over_quota_lag``, on small hand-made clusters."""

from __future__ import annotations

import dataclasses
import math

import pytest

from scheduler.core import decide
from scheduler.model import MILLI, EvictionCause, State
from scheduler.quota import OverQuotaLedger

from .builders import make_node, make_workload, org, snapshot


def test_ledger_charges_the_holder_and_credits_the_waiting_project():
    # Quota 0 both; a holds 2 GPUs over quota, b wants 2 and holds none: each is entitled
    # to 1 GPU of the 2 in use, so a gains 1 GPU/s of lag and b loses as much, decayed.
    _, ps = org(("a", 0), ("b", 0))
    projects = {p.name: p for p in ps}
    ledger = OverQuotaLedger(half_life_s=3600)
    ledger.advance(0)
    ledger.observe(projects, {("a", "default"): 2000}, {("b", "default"): 2000})
    ledger.advance(3600)
    rate = math.log(2) / 3600
    expect = MILLI * (1 - 0.5) / rate  # 1 GPU for an hour, with half of it decayed away by the end
    assert ledger.lag[("a", "default")] == pytest.approx(expect)
    assert ledger.lag[("b", "default")] == pytest.approx(-expect)
    # Nobody wants over quota any more: the lags only decay.
    ledger.observe(projects, {("a", "default"): 0}, {})
    ledger.advance(7200)
    assert ledger.lag[("a", "default")] == pytest.approx(expect / 2)


def test_ledger_ignores_projects_that_want_nothing_over_quota():
    _, ps = org(("a", 2), ("b", 2))
    ledger = OverQuotaLedger(half_life_s=600)
    ledger.advance(0)
    # a at its quota with nothing waiting; b 1 over: only b wants over quota, and it holds
    # all the over-quota GPUs in use, which is its whole share.
    ledger.observe({p.name: p for p in ps}, {("a", "default"): 2000, ("b", "default"): 3000}, {})
    ledger.advance(100)
    assert ledger.lag.get(("a", "default"), 0.0) == 0.0
    assert ledger.lag[("b", "default")] == pytest.approx(0.0)


def test_ledger_rejects_a_bad_half_life():
    with pytest.raises(ValueError, match="fair_share_half_life_s"):
        OverQuotaLedger(half_life_s=0)


def _two_projects():
    # One 8-GPU node; quotas 3 and 3 (2 GPUs nobody is guaranteed). b holds its quota and a
    # 2-GPU pod over it; a holds its quota and waits with a 2-GPU over-quota pod. The
    # instantaneous fair share gives each 1 of the 2 idle GPUs: a's pod (2) is larger than
    # that, so fair-share reclaim never fires for it.
    ds, ps = org(("a", 3), ("b", 3))
    run = [
        make_workload("a-in").project("a").gpus(3).submitted(0).running(("n1", (0, 1, 2), 1000)).obj(),
        make_workload("b-in").project("b").gpus(3).submitted(0).running(("n1", (3, 4, 5), 1000)).obj(),
        make_workload("b-over").project("b").gpus(2).submitted(1).running(("n1", (6, 7), 1000)).obj(),
    ]
    wait = [make_workload("a-over").project("a").gpus(2).submitted(2).obj()]
    return ds, ps, run + wait


@pytest.mark.parametrize("lag_a, lag_b", [(-0.5, 0.5), (-0.1, 1.0), (-3.0, 0.01)])
def test_a_project_behind_over_time_reclaims_from_one_ahead_even_below_one_pod_of_share(lag_a, lag_b):
    ds, ps, ws = _two_projects()
    snap = snapshot([make_node("n1", gpus=8)], ds, ps, ws)
    assert decide(snap).evictions == []  # instantaneous fair share only: a never gets a turn
    # a behind, b ahead, their lags at least a's pod (2 GPUs) x catch_up_s apart.
    unit = 2 * MILLI * snap.config.catch_up_s
    snap.over_quota_lag = {("a", "default"): lag_a * unit, ("b", "default"): lag_b * unit}
    d = decide(snap)
    assert [e.workload for e in d.evictions] == ["b-over"]  # never b's in-quota work
    assert "fair share over time" in d.evictions[0].reason
    assert d.evictions[0].cause == EvictionCause.CATCH_UP
    assert "reclaiming GPUs from 1 workload of project b" in d.reason("a-over")


@pytest.mark.parametrize(
    "lag_a, lag_b",
    [
        (-0.4, 0.5),  # a behind, b ahead, but less than a's pod's GPUs x catch_up_s apart
        (-1.0, 0.0),  # a far behind, b not ahead of its share
        (-1.0, -2.0),  # b further behind than a
        (0.0, 2.0),  # a not behind
    ],
)
def test_no_catch_up_unless_behind_by_a_whole_workload_and_the_victim_is_ahead(lag_a, lag_b):
    ds, ps, ws = _two_projects()
    snap = snapshot([make_node("n1", gpus=8)], ds, ps, ws)
    unit = 2 * MILLI * snap.config.catch_up_s
    snap.over_quota_lag = {("a", "default"): lag_a * unit, ("b", "default"): lag_b * unit}
    assert decide(snap).evictions == []


def test_no_catch_up_for_a_project_that_holds_its_fair_share_now():
    # a holds 4 (quota 3, one over), b 3 + 1 over: each has its fair share of the 2
    # over-quota GPUs. a is far behind over time and waits with 1 GPU more, but at its fair
    # share it repays no history: catch up is for a project below its share now.
    ds, ps = org(("a", 3), ("b", 3))
    ws = [
        make_workload("a-in").project("a").gpus(4).submitted(0).running(("n1", (0, 1, 2, 3), 1000)).obj(),
        make_workload("b-in").project("b").gpus(3).submitted(0).running(("n1", (4, 5, 6), 1000)).obj(),
        make_workload("b-over").project("b").gpus(1).submitted(1).running(("n1", (7,), 1000)).obj(),
        make_workload("a-more").project("a").gpus(1).submitted(2).obj(),
    ]
    snap = snapshot([make_node("n1", gpus=8)], ds, ps, ws)
    unit = MILLI * snap.config.catch_up_s
    snap.over_quota_lag = {("a", "default"): -5 * unit, ("b", "default"): 5 * unit}
    d = decide(snap)
    assert d.fair_share_milli[("a", "default")] == 4000 and d.evictions == []
    # Below its fair share (the same, with a's in-quota pod 3 GPUs) it does catch up.
    ws[0] = make_workload("a-in").project("a").gpus(3).submitted(0).running(("n1", (0, 1, 2), 1000)).obj()
    ws[3] = make_workload("a-more").project("a").gpus(2).submitted(2).obj()
    ws[2] = make_workload("b-over").project("b").gpus(2).submitted(1).running(("n1", (3, 7), 1000)).obj()
    snap = snapshot([make_node("n1", gpus=8)], ds, ps, ws)
    snap.over_quota_lag = {("a", "default"): -5 * unit, ("b", "default"): 5 * unit}
    assert [e.workload for e in decide(snap).evictions] == ["b-over"]


def test_a_pod_within_the_fair_share_catches_up_where_fair_share_reclaim_finds_no_room():
    # One 4-GPU node, quotas 0: b and c each hold a 2-GPU pod over quota, a waits with 1 GPU.
    # a's fair share is the 1 GPU it asks for, b's and c's 1.5 each: a's pod fits a's, but
    # either 2-GPU pod taken would leave its project at 0, below its fair share, so
    # fair-share reclaim finds no room.
    ds, ps = org(("a", 0), ("b", 0), ("c", 0))
    ws = [
        make_workload("b-over").project("b").gpus(2).submitted(0).running(("n1", (0, 1), 1000)).obj(),
        make_workload("c-over").project("c").gpus(2).submitted(0).running(("n1", (2, 3), 1000)).obj(),
        make_workload("a-one").project("a").gpus(1).submitted(1).obj(),
    ]
    snap = snapshot([make_node("n1", gpus=4)], ds, ps, ws)
    d = decide(snap)
    assert [d.fair_share_milli[(p, "default")] for p in "abc"] == [1000, 1500, 1500]
    assert d.evictions == []
    # a behind over time and b ahead, by a's pod x catch_up_s: catch up takes b's pod.
    unit = MILLI * snap.config.catch_up_s
    snap.over_quota_lag = {("a", "default"): -unit, ("b", "default"): unit}
    d = decide(snap)
    assert [(e.workload, e.cause) for e in d.evictions] == [("b-over", EvictionCause.CATCH_UP)]
    # Not from c, which is not ahead; and not at all while a is not behind.
    snap.over_quota_lag = {("a", "default"): 0.0, ("b", "default"): unit}
    assert decide(snap).evictions == []


def test_protected_work_is_never_taken_for_catch_up():
    ds, ps, ws = _two_projects()
    ws = [dataclasses.replace(w, resumed=True, started_at=100.0) if w.name == "b-over" else w for w in ws]
    snap = snapshot([make_node("n1", gpus=8)], ds, ps, ws)
    snap.now = 200.0  # b-over restarted 100 s ago: within the resume protection
    unit = 2 * MILLI * snap.config.catch_up_s
    snap.over_quota_lag = {("a", "default"): -unit, ("b", "default"): unit}
    assert decide(snap).evictions == []


def test_leftovers_go_to_the_project_furthest_behind_first():
    # Two free GPUs and two over-quota pods of 2 GPUs; b's came first in the queue, but a
    # got less than its share lately: a's pod takes the GPUs.
    ds, ps = org(("a", 3), ("b", 3))
    ws = [
        make_workload("a-in").project("a").gpus(3).running(("n1", (0, 1, 2), 1000)).obj(),
        make_workload("b-in").project("b").gpus(3).running(("n1", (3, 4, 5), 1000)).obj(),
        make_workload("b-over").project("b").gpus(2).submitted(1).obj(),
        make_workload("a-over").project("a").gpus(2).submitted(2).obj(),
    ]
    snap = snapshot([make_node("n1", gpus=8)], ds, ps, ws)
    assert [b.workload for b in decide(snap).binds] == ["b-over"]  # queue order without history
    snap.over_quota_lag = {("a", "default"): -1.0, ("b", "default"): 1.0}
    assert [b.workload for b in decide(snap).binds] == ["a-over"]


def _alternate(keep_history: bool) -> tuple[int, int, dict[str, float]]:
    """Two projects with quota 3 each on one 8-GPU node, each always waiting with 2-GPU
    over-quota training (a queue of 30 each, 4 hours of work apiece: longer than a fair
    turn; a's submitted first). Only one pod fits over quota at a time. Replays 8 hours in 10 s cycles, as an
    adapter would: keeps the ledger (or not), binds, lets evicted work exit after its
    grace period and come back resumed. Returns (evictions, thrash, over-quota GPU-s each)."""
    ds, ps = org(("a", 3), ("b", 3))
    projects = {p.name: p for p in ps}
    ws = [
        make_workload("a-in").project("a").gpus(3).preemptible(False).running(("n1", (0, 1, 2), 1000)).obj(),
        make_workload("b-in").project("b").gpus(3).preemptible(False).running(("n1", (3, 4, 5), 1000)).obj(),
    ]
    for i in range(30):  # all of a's before b's: first come, first served favours a
        for p, t0 in (("a", 0), ("b", 100)):
            ws.append(make_workload(f"{p}{i:02}").project(p).gpus(2).submitted(t0 + i).obj())
    snap = snapshot([make_node("n1", gpus=8)], ds, ps, ws, fair_share_half_life_s=3600)
    ledger = OverQuotaLedger(snap.config.fair_share_half_life_s)
    left: dict[str, float] = {}
    over_s = {"a": 0.0, "b": 0.0}
    releasing: dict[str, float] = {}
    evictions = thrash = 0
    t = 0.0
    while t < 8 * 3600:
        ledger.advance(t)
        snap.now = t
        snap.over_quota_lag = dict(ledger.lag) if keep_history else {}
        for name, at in list(releasing.items()):
            if at <= t:  # evicted work exits and waits again, resumed
                w = snap.workloads[name]
                snap.upsert_workload(dataclasses.replace(w, state=State.PENDING, placement=(), resumed=True))
                del releasing[name]
        for w in list(snap.workloads.values()):  # finished work leaves
            if w.state == State.RUNNING and w.name in left and left[w.name] <= t - w.started_at:
                snap.remove_workload(w.name)
        d = decide(snap)
        for b in d.binds:
            w = snap.workloads[b.workload]
            snap.upsert_workload(dataclasses.replace(w, state=State.RUNNING, placement=b.pods, started_at=t))
            left.setdefault(w.name, 4 * 3600.0)
        for e in d.evictions:
            w = snap.workloads[e.workload]
            ran = t - w.started_at
            if w.resumed and ran < snap.config.resume_protection_s:
                thrash += 1
            left[w.name] -= ran
            evictions += 1
            snap.upsert_workload(dataclasses.replace(w, state=State.RELEASING))
            releasing[w.name] = t + e.grace_period_s
        pending = {("a", "default"): 0.0, ("b", "default"): 0.0}
        for w in snap.pending.values():
            pending[(w.project, "default")] += 2000
        ledger.observe(projects, dict(snap.usage), pending)
        for p in over_s:
            over_s[p] += max(0, snap.usage[(p, "default")] - 3000) * 10 / MILLI
        t += 10
    return evictions, thrash, over_s


def test_turns_alternate_over_many_cycles_without_thrash():
    evictions, thrash, over_s = _alternate(keep_history=True)
    assert thrash == 0
    # A turn lasts at least catch_up_s (600 s) of the pod's GPUs behind: few evictions.
    assert 0 < evictions <= 8 * 3600 / 1200
    assert min(over_s.values()) / max(over_s.values()) > 0.9, over_s
    # Without the history first come, first served: a's pods hold the over-quota GPUs throughout.
    evictions, thrash, over_s = _alternate(keep_history=False)
    assert evictions == 0
    assert over_s["b"] == 0, over_s


def test_a_restored_lag_decays_from_when_it_was_recorded():
    ledger = OverQuotaLedger(100.0)
    ledger.restore({("a", "default"): 8000.0}, at=1000.0, now=1100.0)  # one half-life later
    assert ledger.lag_at(1100.0) == {("a", "default"): pytest.approx(4000.0)}
    assert ledger.lag_at(1200.0)[("a", "default")] == pytest.approx(2000.0)


def test_the_lag_is_read_back_from_the_project_status():
    from scheduler.kubernetes.objects import recorded_lag, rfc3339

    objs = [{"metadata": {"name": "a"}, "status": {"overQuotaLagGpuSeconds": {"default": 12, "fast": -3},
                                                   "overQuotaLagAt": rfc3339(1000.5)}},
            {"metadata": {"name": "b"}, "status": {"overQuotaLagGpuSeconds": {"default": 5}}},  # no time: skipped
            {"metadata": {"name": "c"}}]
    lag, at = recorded_lag(objs)
    assert lag == {("a", "default"): 12000.0, ("a", "fast"): -3000.0} and at == pytest.approx(1000.5)
    assert recorded_lag(objs[1:]) is None
