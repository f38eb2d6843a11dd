"""Idleness per fraction on Kubernetes: gpupool-node-agent reads the interception library's
account of each pod with a share in the kubelet's folder of the pod (the emptyDir the
workload contract mounts) and publishes its counters on the Node; the hub's culler reads
them through the API server. Two 0.25 workspaces and a 0.25 training worker on one GPU of
the agent's own kwok node: the accounts are written by the real library (with the fake
libcuda) in a folder laid out as the kubelet's, since kwok runs no container; the workspace
that keeps launching stays, the one that allocated once and the worker that never touched
the GPU are idle."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from hub_ext.backends.kubernetes import ClusterActivity
from hub_ext.config import Gpupool
from hub_ext.requests.rules import workload_name
from hub_ext.service.culler import idle_servers, idle_trainings
from scheduler.contract import REGION_MOUNT, REGION_VOLUME, A, L, gpu_parts, region_host_path
from scheduler.kubernetes.client import ApiError
from scheduler.kubernetes.node_agent import ANN_ACTIVITY, NodeAgent, file_inventory
from scheduler.kubernetes.testcluster import ClusterInfo
from tests.native.conftest import base_env, native, start_probe, wait_for  # noqa: F401  (fixture)

from .helpers import bound, create_org, delete_org, kube, list_pods, make_pod, run, wait_until
from .test_node_agent import _node

IDLE_S = 600.0


def test_a_share_mounts_its_account_in_an_emptydir():
    parts = gpu_parts("p", 0.25)
    assert {"name": REGION_VOLUME, "emptyDir": {}} in parts.volumes
    assert {"name": REGION_VOLUME, "mountPath": REGION_MOUNT} in parts.mounts
    assert parts.env["GPUPOOL_SHARED_REGION"] == f"{REGION_MOUNT}/account"
    assert region_host_path("/var/lib/kubelet/pods", "u1") == \
        "/var/lib/kubelet/pods/u1/volumes/kubernetes.io~empty-dir/gpupool-region/account"
    assert not gpu_parts("p", 2).volumes  # whole GPUs: NVML's utilization, no account


@pytest.mark.slow
def test_the_culler_reads_each_fractions_counters_from_the_node_agent(
        k8s_cluster: ClusterInfo, ns, sched, native, tmp_path):  # noqa: F811
    node = pool = f"idle-{ns[-8:]}"
    inv = tmp_path / "inventory.yaml"
    inv.write_text(yaml.safe_dump({"gpus": [{"index": 0, "uuid": "GPU-idle0", "model": "NVIDIA A100-SXM4-40GB",
                                             "memory_mib": 40960}]}))
    pods_dir = tmp_path / "kubelet-pods"
    pods_dir.mkdir()
    alice, bob = workload_name("alice", "idle"), workload_name("bob", "idle")
    cfg = Gpupool(backend="kubernetes", namespace=ns, kubeconfig=str(k8s_cluster.kubeconfig))
    procs = []

    def account(uid: str) -> Path:
        path = Path(region_host_path(str(pods_dir), uid))
        path.parent.mkdir(parents=True)
        return path

    def probe(uid: str, *cmds: str):
        env = base_env(native, None, GPUPOOL_MEMORY_LIMIT="1G", GPUPOOL_COMPUTE_SHARE="25",
                       GPUPOOL_SHARED_REGION=str(account(uid)))
        procs.append(start_probe(native, env, "dlsym", "init", "ctx:0", *cmds))
        return procs[-1]

    async def go():
        async with kube(k8s_cluster) as kc:
            await kc.post("/api/v1/nodes", _node(node, pool))
            await create_org(kc, "d-idle", 1, {"p-idle": {"gpus": 1}}, pool=pool)
            agent = NodeAgent(kc, node, file_inventory(inv), advertise_capacity=True, pods_dir=pods_dir)
            try:
                await agent.sync()
                for name, workload in (("ws-a", alice), ("ws-b", bob)):
                    await kc.post(f"/api/v1/namespaces/{ns}/pods", make_pod(name).ns(ns).project("p-idle")
                                  .fraction(0.25).kind("workspace").pool(pool).annotate(A.WORKLOAD, workload).obj())
                job = make_pod("job-0").ns(ns).project("p-idle").fraction(0.25).kind("training").pool(pool).obj()
                job["metadata"]["labels"] = {L.TRAINING: "job", L.RANK: "0"}
                await kc.post(f"/api/v1/namespaces/{ns}/pods", job)

                async def placed():
                    pods = bound(await list_pods(kc, ns))
                    return pods if len(pods) == 3 else None
                pods = {p["metadata"]["name"]: p for p in await wait_until(placed, "three shares bound")}
                uid = {n: p["metadata"]["uid"] for n, p in pods.items()}
                placement = {n: [{"node": node, "gpu_indices": [int(p["metadata"]["annotations"][A.GPU_INDICES])],
                                  "gpu_milli": int(p["metadata"]["annotations"][A.GPU_MILLI])}]
                             for n, p in pods.items()}
                a = probe(uid["ws-a"], "launch:1", f"touch:{tmp_path}/a1", f"wait_file:{tmp_path}/go",
                          "launch:1", f"touch:{tmp_path}/a2", f"wait_file:{tmp_path}/end")
                b = probe(uid["ws-b"], "alloc:10M", f"touch:{tmp_path}/b1", f"wait_file:{tmp_path}/end")
                wait_for(tmp_path / "a1", a)
                wait_for(tmp_path / "b1", b)

                activity = ClusterActivity(cfg)
                users = [{"name": u, "servers": {"idle": {"ready": True, "last_activity": None}}}
                         for u in ("alice", "bob")]
                rows = {alice: SimpleNamespace(placement=placement["ws-a"], project="p-idle"),
                        bob: SimpleNamespace(placement=placement["ws-b"], project="p-idle")}
                job_row = SimpleNamespace(name="job", project="p-idle", placement=placement["job-0"], start_time=1.0)
                busy: dict[str, float] = {}
                counts: dict[str, int] = {}
                wbusy: dict[str, float] = {}
                wcounts: dict[str, int] = {}

                async def check(now: float):
                    await agent.sync()
                    await activity.refresh()
                    return (idle_servers(users, rows, None, busy, now, IDLE_S, 1.0, activity, counts),
                            idle_trainings([job_row], None, wbusy, wcounts, now, 1.0, {"p-idle": IDLE_S}, activity))

                assert await check(0.0) == ([], [])
                n = await kc.get(f"/api/v1/nodes/{node}")
                published = json.loads(n["metadata"]["annotations"][ANN_ACTIVITY])
                assert published[uid["ws-a"]][0] == 8 and published[uid["ws-b"]][1] == 1
                assert uid["job-0"] not in published  # never touched the GPU: no account
                (tmp_path / "go").touch()
                wait_for(tmp_path / "a2", a)
                assert await check(IDLE_S / 2) == ([], [])
                return await check(IDLE_S + 1)
            finally:
                (tmp_path / "end").touch()
                for p in procs:
                    p.communicate(timeout=60)
                await delete_org(kc, "d-idle", ["p-idle"])
                try:
                    await kc.request("DELETE", f"/api/v1/namespaces/{ns}/pods",
                                     {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0})
                    await kc.delete(f"/api/v1/nodes/{node}")
                except ApiError:
                    pass

    servers, trainings = run(go())
    assert servers == [("bob", "idle")]  # alice launched between the checks; bob allocated once
    assert [t.name for t in trainings] == ["job"]  # its worker never touched the GPU
