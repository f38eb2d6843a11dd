"""The inventory on Kubernetes (hub_ext.cluster.inventory) against the local cluster: a change
rebuilds only the row of its node, a kubelet's heartbeat or a pod's phase rebuilds nothing,
and the changed rows are written together."""

from __future__ import annotations

import asyncio
import json
import time

from hub_ext.cluster import inventory as k8s_inventory
from hub_ext.cluster.inventory import NODE_USAGE, InventorySync
from hub_ext.db.tables import NodeRow
from hub_ext.schema import make_sessionmaker
from scheduler.contract import A
from scheduler.kubernetes.testcluster import ClusterInfo

from .helpers import kube, make_pod, run, wait_until


def test_only_the_changed_node_is_rebuilt_and_writes_are_batched(k8s_cluster: ClusterInfo, ns, tmp_path,
                                                                monkeypatch):
    Session = make_sessionmaker(f"sqlite:///{tmp_path}/hub.db")
    built: list[str] = []
    real = k8s_inventory.node_gpus

    def counting(node: dict) -> list[dict]:
        built.append(node["metadata"]["name"])
        return real(node)
    monkeypatch.setattr(k8s_inventory, "node_gpus", counting)

    def row(name: str) -> NodeRow:
        with Session() as s:
            return s.get(NodeRow, name)

    async def go():
        async with kube(k8s_cluster) as kc:
            names = sorted(n["metadata"]["name"] for n in (await kc.get("/api/v1/nodes"))["items"])
            a, b = names[0], names[1]
            inv = InventorySync(kc, Session, ns, flush_s=3600)  # flushed by the test below
            inv.start()
            try:
                await wait_until(lambda: _now(row(a) is not None and row(b) is not None), "the first copy", timeout=60)
                assert inv.stats["writes"] == 1
                built.clear()

                async def seen(obj: dict, kind: str, key: str):
                    """The copy has caught up with ``obj`` (etcd's versions grow; kwok may
                    have changed it again since)."""
                    rv = int(obj["metadata"]["resourceVersion"])
                    return await wait_until(lambda: _now(
                        int((inv.objects[kind].get(key) or {}).get("metadata", {}).get("resourceVersion", 0)) >= rv),
                        f"{key} at {rv} in the copy", timeout=60)

                # heartbeats change nothing the inventory stores
                for _ in range(3):
                    beat = {"status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                                       "lastHeartbeatTime": _rfc3339()}]}}
                    await seen(await kc.patch(f"/api/v1/nodes/{a}/status", beat, kind="strategic"), "nodes", a)
                assert built == [] and inv.dirty == set()

                # a use reading on two nodes: two rows built, one write
                for n, pct in ((a, 40), (b, 60)):
                    usage = json.dumps([{"index": 0, "memory_used_mib": 1024, "utilization": pct}])
                    await seen(await kc.patch(f"/api/v1/nodes/{n}", {"metadata": {"annotations": {NODE_USAGE: usage}}}),
                               "nodes", n)
                assert inv.dirty == {a, b}
                inv.flush()
                assert sorted(built) == [a, b] and inv.stats["writes"] == 2
                assert row(a).gpus[0]["utilization_pct"] == 40 and row(b).gpus[0]["utilization_pct"] == 60
                built.clear()

                # a pod on half of GPU 0 of node a: that row only; its phase changes nothing
                pod = make_pod("inv-a").ns(ns).project("p-inv").obj()
                pod["spec"]["nodeName"] = a
                pod["metadata"]["annotations"].update({A.GPU_INDICES: "0", A.GPU_MILLI: "500"})
                created = await kc.post(f"/api/v1/namespaces/{ns}/pods", pod)
                await seen(created, "pods", f"{ns}/inv-a")
                assert inv.dirty == {a}
                inv.flush()
                assert built == [a] and inv.stats["writes"] == 3
                assert [(p["pod"], p["gpu"]) for p in row(a).gpus[0]["pods"]] == [("inv-a", 0.5)]
                await wait_until(lambda: _now((inv.objects["pods"][f"{ns}/inv-a"].get("status") or {})
                                              .get("phase") == "Running"), "the pod running", timeout=60)
                assert inv.dirty == set()
                inv.flush()
                assert built == [a] and inv.stats["writes"] == 3
            finally:
                await inv.stop()
                for n in (a, b):
                    await kc.patch(f"/api/v1/nodes/{n}", {"metadata": {"annotations": {NODE_USAGE: None}}})

    run(go())


async def _now(v):
    return v


def _rfc3339() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def test_inventory_flush_is_scheduled_once_per_batch():
    """Without a cluster: many changes before the flush is due make one pending flush."""
    async def go():
        inv = InventorySync(None, None, "ns", flush_s=3600)  # type: ignore[arg-type]
        inv.synced = {"nodes": True, "pods": True}
        node = {"metadata": {"name": "n1", "annotations": {}}, "status": {"allocatable": {"cpu": "1"}}}
        for i in range(5):
            inv.updated("nodes", node, {**node, "metadata": {"name": "n1", "annotations": {"x": str(i)}}})
        handle = inv._flush
        assert handle is not None and inv.dirty == {"n1"}
        inv.updated("nodes", node, {**node, "metadata": {"name": "n1", "annotations": {"x": "y"}}})
        assert inv._flush is handle  # the same pending write
        handle.cancel()

    asyncio.run(go())
