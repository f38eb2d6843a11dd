"""The embedded adapter's loop on a fake store: binds wake the waiter, releases free the
GPUs at once, a quota shrink reclaims over-quota work through the evictor."""

import asyncio
import dataclasses

import pytest

from scheduler.embedded.adapter import EmbeddedScheduler, gpu_env
from scheduler.model import (
    DEFAULT_POOL,
    GPU,
    Department,
    Kind,
    Node,
    PodDemand,
    PodPlacement,
    Project,
    Quota,
    State,
    Workload,
)


class FakeStore:
    def __init__(self, project_gpus=1.0):
        self.v = 1
        self.project_gpus = project_gpus
        self.events, self.states = [], {}

    def version(self):
        return self.v

    def load_org(self):
        return ([Department("d", {DEFAULT_POOL: Quota(4)})],
                [Project("p", "d", {DEFAULT_POOL: Quota(self.project_gpus)}),
                 Project("q", "d", {DEFAULT_POOL: Quota(4 - self.project_gpus)})])

    def load_workloads(self):
        return []

    def record(self, decisions, snapshot):
        pass

    def set_state(self, name, state, **fields):
        self.states[name] = state

    def finish_stop(self, name):
        self.states[name] = "stopped"

    def event(self, kind, message, workload="", project=""):
        self.events.append((kind, workload))


NODE = Node("n", [GPU(i, "H100", 81920) for i in range(2)])


def ws(name, frac=0.25, project="p", kind=Kind.WORKSPACE, preemptible=None):
    return Workload(name, project, kind, PodDemand(gpu_fraction=frac), preemptible=preemptible)


def test_bind_release_and_pending_reason():
    async def run():
        sched = EmbeddedScheduler(FakeStore(project_gpus=1.0), [NODE], period_s=0.05)
        sched.start()
        a = sched.submit(ws("a", 0.5))
        bind = await asyncio.wait_for(a.bound, 5)
        assert bind.pods[0].gpu_milli == 500
        b = sched.submit(Workload("b", "p", Kind.WORKSPACE, PodDemand(gpus=1)))
        pending = await asyncio.wait_for(b.updates.get(), 5)
        assert pending.workload == "b" and pending.reason and pending.queue_position == 1
        sched.release("a")
        bind_b = await asyncio.wait_for(b.bound, 5)
        assert bind_b.pods[0].gpu_milli == 1000
        await sched.stop()
        return sched

    sched = asyncio.run(run())
    assert ("placed", "a") in sched.store.events and ("released", "a") in sched.store.events


def test_eviction_calls_the_evictor_then_requeues():
    async def run():
        store = FakeStore(project_gpus=0.0)  # p has no quota: its training runs over quota
        sched = EmbeddedScheduler(store, [NODE], period_s=0.05)
        evicted = asyncio.Event()

        async def evict(grace):
            evicted.set()
            sched.requeue("t")

        t = sched.submit(Workload("t", "p", Kind.TRAINING, PodDemand(gpus=2)), evict=evict)
        await sched.cycle()
        assert t.bound.done() and t.bound.result().over_quota
        # q claims its guaranteed GPUs back
        sched.submit(Workload("w", "q", Kind.WORKSPACE, PodDemand(gpus=2)))
        await sched.cycle()
        await asyncio.wait_for(evicted.wait(), 5)
        return sched, store

    sched, store = asyncio.run(run())
    assert store.states["t"] == "pending"
    assert any(k == "preempted" for k, _ in store.events)


def test_a_workspace_starts_beside_its_projects_borrowed_training():
    """p (quota 1 of the 2 GPUs) runs a 1-GPU training; p's workspace is still inside p's
    quota of guaranteed work (training gives way: it is not counted), so it starts in q's
    idle GPU at once, bound in quota, and the training is now p's borrowed GPU. A second
    workspace waits, and its reason says what was counted."""
    async def evict(grace):
        pass

    async def run():
        sched = EmbeddedScheduler(FakeStore(project_gpus=1.0), [NODE], period_s=0.05)
        t = sched.submit(Workload("t", "p", Kind.TRAINING, PodDemand(gpus=1)), evict=evict)
        await sched.cycle()
        assert t.bound.done() and not t.bound.result().over_quota
        w = sched.submit(Workload("w", "p", Kind.WORKSPACE, PodDemand(gpus=1)))
        await sched.cycle()
        assert w.bound.done() and not w.bound.result().over_quota
        w2 = sched.submit(ws("w2", 0.5))
        await sched.cycle()
        pending = await asyncio.wait_for(w2.updates.get(), 5)
        return pending

    pending = asyncio.run(run())
    assert pending.reason.startswith("project p is at its quota 1/1 GPUs of guaranteed work")


class NoQuotaStore(FakeStore):
    def load_org(self):
        return ([Department("d", {DEFAULT_POOL: Quota(0)})],
                [Project("p", "d", {DEFAULT_POOL: Quota(0)}), Project("q", "d", {DEFAULT_POOL: Quota(0)})])


def test_the_adapter_keeps_each_projects_over_quota_lag_for_the_core():
    # Neither project has quota. p runs 2 GPUs of training, all the node has; q waits with
    # training too. Both want over-quota GPUs and p holds them all, so p's lag grows and q's
    # falls by as much; the next cycle's snapshot carries them to the core.
    async def run():
        sched = EmbeddedScheduler(NoQuotaStore(), [NODE], period_s=0.05)
        sched.submit(Workload("t", "p", Kind.TRAINING, PodDemand(gpus=2)))
        await sched.cycle()
        sched.submit(Workload("u", "q", Kind.TRAINING, PodDemand(gpus=1)))
        await sched.cycle()
        assert sched.snapshot.pending.keys() == {"u"}
        await asyncio.sleep(0.05)
        await sched.cycle()
        return sched

    sched = asyncio.run(run())
    lag = sched.snapshot.over_quota_lag
    assert lag[("p", DEFAULT_POOL)] > 0 > lag[("q", DEFAULT_POOL)]
    assert lag[("p", DEFAULT_POOL)] == -lag[("q", DEFAULT_POOL)]


def test_fair_share_over_time_off_keeps_no_lag():
    # The same cycles with SchedulerConfig.fair_share_over_time off: the core sees every
    # project even (an empty lag), as it would on an adapter that keeps none.
    async def run():
        sched = EmbeddedScheduler(NoQuotaStore(), [NODE], period_s=0.05)
        sched.snapshot.config = dataclasses.replace(sched.snapshot.config, fair_share_over_time=False)
        sched.submit(Workload("t", "p", Kind.TRAINING, PodDemand(gpus=2)))
        await sched.cycle()
        sched.submit(Workload("u", "q", Kind.TRAINING, PodDemand(gpus=1)))
        await sched.cycle()
        await asyncio.sleep(0.05)
        await sched.cycle()
        return sched

    sched = asyncio.run(run())
    assert sched.snapshot.pending.keys() == {"u"}
    assert sched.snapshot.over_quota_lag == {} and sched.ledger.lag == {}


def test_gpu_env_for_a_fraction():
    env = gpu_env(NODE, PodPlacement("n", (1,), 250), 0, "/nonexistent.so", "ws-a")
    assert env["CUDA_VISIBLE_DEVICES"] == "1"
    assert env["GPUPOOL_MEMORY_LIMIT"] == str(81920 * 2**20 // 4)  # bytes, as on Kubernetes
    assert env["GPUPOOL_COMPUTE_SHARE"] == "25"
    assert "LD_PRELOAD" not in env


class StoredBadValueStore(FakeStore):
    """An organisation as an older release or a hand edit may have stored it: one bad
    value per queue kind; ``fixed`` puts the good values back."""

    def __init__(self, bad):
        super().__init__()
        self.bad, self.fixed = bad, False
        self.reasons = {}

    def load_org(self):
        d, q = Quota(4), Quota(2)
        if not self.fixed:
            d, q = self.bad.get("d", d), self.bad.get("q", q)
        return ([Department("d", {DEFAULT_POOL: d}), Department("e", {DEFAULT_POOL: Quota(2)})],
                [Project("p", "e", {DEFAULT_POOL: Quota(2)}), Project("q", "d", {DEFAULT_POOL: q})])

    def record(self, decisions, snapshot):
        self.reasons.update({p.workload: p.reason for p in decisions.pending})


@pytest.mark.parametrize("bad, isolated", [
    ({"q": Quota(1, 1, 1e307)}, "project q"),  # the limit that overflowed the milli-GPU sums
    ({"q": Quota(float("nan"))}, "project q"),
    ({"q": Quota(-2)}, "project q"),
    ({"q": Quota(1, "heavy")}, "project q"),  # SQLite keeps any type in a REAL column
    ({"q": Quota(1, None)}, "project q"),
    ({"d": Quota(float("inf"))}, "department d"),
], ids=["limit-1e307", "nan-quota", "negative-quota", "text-weight", "null-weight", "infinite-department"])
def test_a_stored_bad_value_isolates_its_queue_and_the_cycle_goes_on(bad, isolated):
    async def run():
        store = StoredBadValueStore(bad)
        sched = EmbeddedScheduler(store, [NODE], period_s=0.05)
        a = sched.submit(Workload("a", "p", Kind.WORKSPACE, PodDemand(gpus=1)))
        b = sched.submit(Workload("b", "q", Kind.WORKSPACE, PodDemand(gpus=1)))
        await sched.cycle()
        assert a.bound.done() and not b.bound.done()
        why = store.reasons["b"]
        store.fixed, store.v = True, store.v + 1
        await sched.cycle()
        assert b.bound.done()
        return store, why

    store, why = asyncio.run(run())
    assert why.startswith(f"{isolated} is left out of scheduling: ")
    assert ("isolated", "") in store.events and ("restored", "") in store.events


class LeftoverStore(FakeStore):
    """A workload stored as running that nothing of this process runs (a row an older
    release left), then asked to stop (the row leaves the active states)."""

    def __init__(self):
        super().__init__()
        w = ws("left", 0.5)
        w.state, w.placement = State.RUNNING, (PodPlacement("n", (0,), 500),)
        self.rows = [w]

    def load_workloads(self):
        return self.rows


def test_a_stop_of_work_nothing_runs_ends_stopped_and_frees_its_gpus_at_once():
    async def run():
        store = LeftoverStore()
        sched = EmbeddedScheduler(store, [NODE], period_s=0.05)
        await sched.cycle()
        held = sched.snapshot.usage[("p", DEFAULT_POOL)]
        store.rows, store.v = [], store.v + 1
        await sched.cycle()
        return sched, store, held

    sched, store, held = asyncio.run(run())
    assert held == 500
    assert "left" not in sched.snapshot.workloads and sched.snapshot.usage[("p", DEFAULT_POOL)] == 0
    assert store.states["left"] == "stopped"


def test_running_work_of_a_queue_left_out_keeps_its_gpus_and_others_are_placed():
    async def run():
        store = StoredBadValueStore({"q": Quota(1, 1, 1e307)})
        store.fixed = True
        sched = EmbeddedScheduler(store, [NODE], period_s=0.05)
        b = sched.submit(Workload("b", "q", Kind.WORKSPACE, PodDemand(gpus=1)))
        await sched.cycle()
        assert b.bound.done()
        store.fixed, store.v = False, store.v + 1  # the bad value arrives while b runs
        a = sched.submit(Workload("a", "p", Kind.WORKSPACE, PodDemand(gpus=1)))
        c = sched.submit(Workload("c", "q", Kind.WORKSPACE, PodDemand(gpus=1)))
        for _ in range(3):
            await sched.cycle()
        return sched, store, a, c

    sched, store, a, c = asyncio.run(run())
    assert a.bound.done() and not c.bound.done()
    assert sched.snapshot.usage[("q", DEFAULT_POOL)] == 1000  # b still holds its GPU
    assert store.reasons["c"].startswith("project q is left out of scheduling: ")


@pytest.mark.parametrize("on", [False, True])
def test_the_hub_s_consolidate_in_quota_option_reaches_the_scheduler(tmp_path, on):
    from traitlets.config import Config

    from hub_ext.config import Gpupool
    from hub_ext.runtime import Runtime

    # On by default (record 0050): the option is set only to turn it off.
    options = {"state_dir": str(tmp_path), **({} if on else {"consolidate_in_quota": False})}
    cfg = Gpupool(config=Config({"Gpupool": options}))
    assert Runtime(cfg).embedded.scheduler.snapshot.config.consolidate_in_quota is on
