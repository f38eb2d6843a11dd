"""The event log on Kubernetes (hub_ext/cluster/events.py): a pod gpupool-scheduler binds
and then is deleted gives ``placed`` at its bind and ``released`` at its deletion, and its
GPU-hours are its GPUs times the time between the two; an evicted pod also gives
``preempted``, known from the mark gpupool-scheduler leaves on the pod: the follower never
asks the API server for Events."""

from __future__ import annotations

import asyncio
import time

from hub_ext.cluster.events import PodEvents, bind_time, end_time
from hub_ext.db import accounting
from hub_ext.db.tables import EventRow, WorkloadRow
from hub_ext.schema import make_sessionmaker
from scheduler.contract import waiting_reason, workload_annotations
from scheduler.kubernetes.testcluster import ClusterInfo

from .helpers import count_reads, create_org, delete_org, kube, make_pod, run, wait_until


def _labelled(pod: dict, workload: str, owner: str) -> dict:
    pod["metadata"]["annotations"].update(workload_annotations(workload, owner))
    return pod


def test_gpu_hours_of_a_workspace_are_its_bind_to_its_deletion(k8s_cluster: ClusterInfo, ns, sched, tmp_path):
    Session = make_sessionmaker(f"sqlite:///{tmp_path}/hub.db")
    projects = {"p-ev-ws": {"gpus": 2}, "p-ev-low": {"gpus": 0}}

    def events(workload: str) -> dict[str, EventRow]:
        with Session() as s:
            return {e.kind: e for e in s.query(EventRow).filter(EventRow.workload == workload)}

    async def go():
        async with kube(k8s_cluster) as kc:
            await create_org(kc, "d-ev", 2, projects)
            reads = count_reads(kc, lambda path: path.endswith("/events"))
            follower = PodEvents(kc, Session, ns)
            task = asyncio.ensure_future(follower.run())
            try:
                pod = _labelled(make_pod("ws-a").ns(ns).project("p-ev-ws").kind("workspace").fraction(0.5)
                                .grace(30).obj(), "alice/ws", "alice")
                await kc.post(f"/api/v1/namespaces/{ns}/pods", pod)

                async def bound():
                    p = await kc.get(f"/api/v1/namespaces/{ns}/pods/ws-a")
                    return p if bind_time(p) else None
                p = await wait_until(bound, "the workspace bound")
                await wait_until(lambda: _async("placed" in events("alice/ws")), "placed in the log", timeout=60)
                await asyncio.sleep(2)  # the API's times are whole seconds: a span to count
                asked = time.time()
                deleting = await kc.delete(f"/api/v1/namespaces/{ns}/pods/ws-a")

                async def gone():
                    return not [x for x in (await kc.get(f"/api/v1/namespaces/{ns}/pods"))["items"]
                                if x["metadata"]["name"] == "ws-a"]
                await wait_until(gone, "the pod gone")
                seen_gone = time.time()
                await wait_until(lambda: _async("released" in events("alice/ws")), "released in the log", timeout=60)
                assert reads == []  # a user's delete is not looked up as a possible eviction
                return p, deleting, asked, seen_gone
            finally:
                task.cancel()
                await delete_org(kc, "d-ev", projects)

    pod, deleting, asked, seen_gone = run(go())
    ev = events("alice/ws")
    assert ev["placed"].ts == bind_time(pod)
    # released when the pod ended: after the delete was asked (the API's times are whole
    # seconds), before the test saw it gone
    assert int(asked) <= ev["released"].ts <= seen_gone
    assert ev["released"].ts <= end_time(deleting, float("inf"))  # never past its grace period
    assert (ev["placed"].gpus, ev["placed"].user, ev["placed"].project) == (0.5, "alice", "p-ev-ws")
    assert ev["placed"].placement[0]["gpu_milli"] == 500
    with Session() as s:
        rows = accounting.report(s, ev["placed"].ts - 10, time.time() + 10, "user")["items"]
    (alice,) = [r for r in rows if r["name"] == "alice"]
    assert ev["released"].ts > ev["placed"].ts
    assert alice["gpu_hours"] == round(0.5 * (ev["released"].ts - bind_time(pod)) / 3600, 6)
    assert "preempted" not in ev


async def _async(v):
    return v


def test_an_evicted_pod_is_preempted_in_the_log(k8s_cluster: ClusterInfo, ns, sched, tmp_path):
    Session = make_sessionmaker(f"sqlite:///{tmp_path}/hub.db")
    projects = {"p-ev2-hi": {"gpus": 32}, "p-ev2-lo": {"gpus": 0}}

    def kinds(workload: str) -> set[str]:
        with Session() as s:
            return {e.kind for e in s.query(EventRow).filter(EventRow.workload == workload)}

    async def go():
        async with kube(k8s_cluster) as kc:
            await create_org(kc, "d-ev2", 32, projects)
            reads = count_reads(kc, lambda path: path.endswith("/events"))
            task = asyncio.ensure_future(PodEvents(kc, Session, ns).run())
            try:
                # over quota, the whole cluster: anything in quota takes it back
                for i in range(4):
                    await kc.post(f"/api/v1/namespaces/{ns}/pods", _labelled(
                        make_pod(f"lo-{i}").ns(ns).project("p-ev2-lo").kind("training").gpus(8).grace(0).obj(),
                        f"lo-{i}", "bob"))
                await wait_until(lambda: _async(all("placed" in kinds(f"lo-{i}") for i in range(4))),
                                 "the low pods placed")
                await kc.post(f"/api/v1/namespaces/{ns}/pods", _labelled(
                    make_pod("hi").ns(ns).project("p-ev2-hi").kind("workspace").gpus(8).obj(), "hi", "carol"))
                await wait_until(lambda: _async(any({"preempted", "released"} <= kinds(f"lo-{i}")
                                                    for i in range(4))), "a low pod evicted", timeout=60)
                await wait_until(lambda: _async("placed" in kinds("hi")), "the workspace placed")
                assert reads == []
                evicted = [i for i in range(4) if "preempted" in kinds(f"lo-{i}")]
                assert evicted and all("released" in kinds(f"lo-{i}") for i in evicted)
                assert "preempted" not in kinds("hi")
            finally:
                task.cancel()
                await delete_org(kc, "d-ev2", projects)

    run(go())


def test_a_waiting_workspace_row_carries_the_schedulers_reason(k8s_cluster: ClusterInfo, ns, sched, tmp_path):
    """As in embedded mode, the hub's row of a waiting workspace says why it waits: the
    reason gpupool-scheduler wrote on its pod (REST, the CLI, the queue and home pages show
    the row)."""
    Session = make_sessionmaker(f"sqlite:///{tmp_path}/hub.db")
    projects = {"p-ev-wait": {"gpus": 1}}
    with Session() as s:
        s.add(WorkloadRow(name="alice/wait", owner="alice", project="p-ev-wait", kind="workspace",
                          state="pending"))
        s.commit()

    def row_reason() -> str:
        with Session() as s:
            return s.get(WorkloadRow, "alice/wait").reason

    async def go():
        async with kube(k8s_cluster) as kc:
            await create_org(kc, "d-ev-wait", 1, projects)
            follower = PodEvents(kc, Session, ns)
            task = asyncio.ensure_future(follower.run())
            try:  # more GPUs than any node has: it waits, with the scheduler's reason
                pod = _labelled(make_pod("ws-wait").ns(ns).project("p-ev-wait").kind("workspace").gpus(64)
                                .obj(), "alice/wait", "alice")
                await kc.post(f"/api/v1/namespaces/{ns}/pods", pod)

                async def told():
                    return waiting_reason(await kc.get(f"/api/v1/namespaces/{ns}/pods/ws-wait"))
                why = await wait_until(told, "the scheduler's reason on the pod")
                await wait_until(lambda: _async(row_reason() == why), "the reason on the hub's row", timeout=60)
                return why
            finally:
                task.cancel()
                await kc.delete(f"/api/v1/namespaces/{ns}/pods/ws-wait")
                await delete_org(kc, "d-ev-wait", projects)

    why = run(go())
    assert why and row_reason() == why
    with Session() as s:
        assert s.get(WorkloadRow, "alice/wait").state == "pending"
