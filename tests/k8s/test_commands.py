"""Command workloads (``POST /workloads`` of a kind other than a workspace) on the local
cluster: the hub's runner makes one pod per pending row, gpupool-scheduler binds it, the row
runs (the event log's follower), an eviction puts it back in the queue and makes it again,
the container's exit ends it, a stop deletes the pod. The workload's log is looked up by the
pod's ``gpupool.io/workload`` annotation and asked of the API server (``pods/NAME/log``);
kwok nodes run no container, so what a log holds is the real node's to show."""

from __future__ import annotations

import asyncio
import time

from hub_ext.backends.kubernetes import workload_pod
from hub_ext.backends.kubernetes_commands import LABEL, KubernetesCommands, command_pod
from hub_ext.cluster.events import PodEvents
from hub_ext.db.tables import EventRow, WorkloadRow
from hub_ext.requests.rules import WorkloadRequest
from hub_ext.schema import make_sessionmaker
from scheduler.contract import A
from scheduler.kubernetes.testcluster import ClusterInfo

from .helpers import create_org, delete_org, kube, run, wait_until


def test_command_pod_carries_the_request():
    req = WorkloadRequest(project="p", kind="inference", gpu_mode="fraction", gpu_fraction=0.5, cpu=2,
                          memory_gib=3, command=["python", "serve.py"])
    pod = command_pod("job-1", "alice", req, "ns", "img:1")
    ann = pod["metadata"]["annotations"]
    assert (ann[A.PROJECT], ann[A.KIND], ann[A.FRACTION], ann[A.WORKLOAD], ann[A.OWNER]) == \
        ("p", "inference", "0.5", "job-1", "alice")
    (ctr,) = pod["spec"]["containers"]
    assert ctr["command"] == ["python", "serve.py"] and ctr["image"] == "img:1"
    assert ctr["resources"]["requests"] == {"cpu": "2", "memory": "3072Mi"}
    assert pod["spec"]["schedulerName"] == "gpupool" and pod["spec"]["restartPolicy"] == "Never"
    assert pod["metadata"]["labels"][LABEL] == "job-1"


def test_submitted_commands_run_as_pods_and_end_with_their_exit(k8s_cluster: ClusterInfo, ns, sched, tmp_path):
    Session = make_sessionmaker(f"sqlite:///{tmp_path}/hub.db")
    api = f"/api/v1/namespaces/{ns}/pods"

    def add(name: str, gpus: int) -> None:
        req = WorkloadRequest(project="p-cmd", kind="training", gpu_mode="whole", gpus=gpus, cpu=0.5,
                              memory_gib=1, command=["python", "train.py"], preemptible=True)
        with Session() as s:
            s.add(WorkloadRow(name=name, owner="alice", project="p-cmd", kind="training", spec=req.to_dict(),
                              state="pending", submit_time=time.time()))
            s.commit()

    def state(name: str) -> str:
        with Session() as s:
            w = s.get(WorkloadRow, name)
            return w.state if w is not None else "gone"

    async def until(name: str, want: str):
        async def check():
            return state(name) == want
        await wait_until(check, f"{name} {want}", timeout=120)

    async def go():
        async with kube(k8s_cluster) as kc, kube(k8s_cluster) as hub_kc:
            await create_org(kc, "d-cmd", 32, {"p-cmd": {"gpus": 0}, "p-cmd-ws": {"gpus": 32}})
            runner = KubernetesCommands(hub_kc, Session, ns, poll_s=0.2)
            events = asyncio.ensure_future(PodEvents(hub_kc, Session, ns).run())
            runner.start()
            try:
                add("cmd-a", 8)
                await until("cmd-a", "running")
                first = await kc.get(f"{api}/cmd-a")
                assert first["spec"]["nodeName"]
                with Session() as s:
                    assert s.get(WorkloadRow, "cmd-a").placement[0]["node"] == first["spec"]["nodeName"]
                # the log is asked of the API server for the pod of that workload
                assert (await workload_pod(hub_kc, api, "cmd-a"))["metadata"]["uid"] == first["metadata"]["uid"]
                assert await workload_pod(hub_kc, api, "cmd-a", service="other") is None
                # gpupool-scheduler evicts by deleting: back to pending, then a new pod
                await kc.delete(f"{api}/cmd-a", {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0})

                async def again():
                    pods, _ = await kc.list_all(api, labelSelector=f"{LABEL}=cmd-a")
                    return [p for p in pods if p["metadata"]["uid"] != first["metadata"]["uid"]
                            and p["spec"].get("nodeName")]
                (second,) = await wait_until(again, "cmd-a made again and bound", timeout=120)
                await until("cmd-a", "running")
                # the container's exit ends it
                await kc.patch(f"{api}/cmd-a/status", {"status": {"phase": "Failed", "containerStatuses": [{
                    "name": "command", "image": "x", "imageID": "", "ready": False, "restartCount": 0,
                    "state": {"terminated": {"exitCode": 3, "reason": "Error"}}}]}})
                await until("cmd-a", "failed")
                with Session() as s:
                    assert s.get(WorkloadRow, "cmd-a").reason == "exited with code 3 (Error)"
                    assert s.query(EventRow).filter(EventRow.workload == "cmd-a", EventRow.kind == "exited").count() == 1

                async def pod_gone():
                    pods, _ = await kc.list_all(api, labelSelector=f"{LABEL}=cmd-a")
                    return not pods
                await wait_until(pod_gone, "the ended pod deleted", timeout=60)
                # a stop request (DELETE /workloads/NAME of a running one) deletes the pod
                add("cmd-b", 1)
                await until("cmd-b", "running")
                with Session() as s:
                    s.get(WorkloadRow, "cmd-b").state = "stopping"
                    s.commit()
                await until("cmd-b", "stopped")

                async def b_gone():
                    pods, _ = await kc.list_all(api, labelSelector=f"{LABEL}=cmd-b")
                    return not pods
                await wait_until(b_gone, "cmd-b's pod deleted", timeout=60)
            finally:
                events.cancel()
                await runner.stop()
                await delete_org(kc, "d-cmd", ["p-cmd", "p-cmd-ws"])

    run(asyncio.wait_for(go(), 300))
