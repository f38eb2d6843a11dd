"""gpupool-scheduler on a cluster it shares, against the real API server (kwok nodes):
node selectors, node affinity, taints and tolerations; other schedulers' and DaemonSets'
pods; volume binding; CPU quotas from the Project; a gang's topology; the over-quota lag
across a restart. Each test makes its own nodes, in a node pool of its own, and removes them.
"""

from __future__ import annotations

import re
import time

from scheduler.kubernetes.client import ApiError
from scheduler.kubernetes.objects import parse_time
from scheduler.kubernetes.testcluster import ClusterInfo

from .helpers import (
    GROUP,
    bound,
    create_org,
    delete_org,
    events_for,
    kube,
    list_pods,
    make_pod,
    run,
    scheduled_false,
    wait_until,
)

GPU_LABELS = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.memory": "81559"}


def _node(name: str, pool: str, labels: dict | None = None, taints: list | None = None,
          gpus: int = 2, cpu: str = "16") -> dict:
    alloc = {"cpu": cpu, "memory": "64Gi", "pods": "110", "nvidia.com/gpu": str(gpus)}
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name,
                         "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
                         "labels": {"type": "kwok", "kubernetes.io/hostname": name,
                                    "gpupool.io/node-pool": pool, **GPU_LABELS, **(labels or {})}},
            "spec": {"taints": taints or []},
            "status": {"allocatable": alloc, "capacity": alloc}}


class OwnNodes:
    """Nodes of one test, in its own node pool; deleted with ``remove``."""

    def __init__(self, kc, ns: str):
        self.kc, self.pool, self.names = kc, f"p-{ns[-8:]}", []

    def name(self, short: str) -> str:
        return f"{self.pool}-{short}"

    async def add(self, short: str, **kw) -> str:
        name = self.name(short)
        await self.kc.post("/api/v1/nodes", _node(name, self.pool, **kw))
        self.names.append(name)
        return name

    async def remove(self) -> None:
        for name in self.names:
            try:
                await self.kc.delete(f"/api/v1/nodes/{name}")
            except ApiError:
                pass


async def _post(kc, ns: str, pod: dict) -> None:
    await kc.post(f"/api/v1/namespaces/{ns}/pods", pod)


def _with_spec(builder, **spec) -> dict:
    obj = builder.obj()
    obj["spec"].update(spec)
    return obj


def _affinity(*terms: dict) -> dict:
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}}}


def _name_in(*names: str) -> dict:
    return {"matchFields": [{"key": "metadata.name", "operator": "In", "values": list(names)}]}


async def _pod(kc, ns: str, name: str) -> dict:
    return await kc.get(f"/api/v1/namespaces/{ns}/pods/{name}")


async def _phase(kc, ns: str, name: str, phase: str) -> bool:
    return (await _pod(kc, ns, name)).get("status", {}).get("phase") == phase


async def _placed(kc, ns: str, names: list[str]) -> dict[str, str] | None:
    """{pod: node} once every named pod is bound."""
    pods = {p["metadata"]["name"]: p for p in await list_pods(kc, ns)}
    where = {n: (pods.get(n) or {}).get("spec", {}).get("nodeName") for n in names}
    return where if all(where.values()) else None


async def _waiting_with(kc, ns: str, name: str, pattern: str) -> str | None:
    cond = scheduled_false(await _pod(kc, ns, name))
    return cond["message"] if cond and re.search(pattern, cond["message"]) else None


def test_selectors_affinity_and_taints_decide_the_node_and_name_the_reason(k8s_cluster: ClusterInfo, ns, sched):
    async def go():
        async with kube(k8s_cluster) as kc:
            nodes = OwnNodes(kc, ns)
            dedicated = [{"key": "dedicated", "value": "ml", "effect": "NoSchedule"}]
            try:
                a = await nodes.add("a", labels={"zone": "z1", "gen": "3"})
                b = await nodes.add("b", labels={"zone": "z2", "gen": "1"})
                c = await nodes.add("c", labels={"zone": "z2", "gen": "5"}, taints=dedicated)
                await create_org(kc, "d-shared", 6, {"p-shared": {"gpus": 6}}, pool=nodes.pool)

                def pod(name):
                    return make_pod(name).ns(ns).project("p-shared").kind("workspace").gpus(1).pool(nodes.pool)

                gt2 = {"matchExpressions": [{"key": "gen", "operator": "Gt", "values": ["2"]}]}
                pods = {
                    "nowhere": _with_spec(pod("nowhere"), nodeSelector={"zone": "z9"}),
                    "z1": _with_spec(pod("z1"), nodeSelector={"zone": "z1"}),
                    "untolerated": _with_spec(pod("untolerated"), affinity=_affinity(_name_in(c))),
                    "tolerates": _with_spec(pod("tolerates"), affinity=_affinity(_name_in(c)),
                                            tolerations=[{"key": "dedicated", "operator": "Equal",
                                                          "value": "ml", "effect": "NoSchedule"}]),
                    "any-taint": _with_spec(pod("any-taint"), affinity=_affinity(_name_in(c)),
                                            tolerations=[{"operator": "Exists"}]),
                    # zone NotIn z1 leaves b and c; gen > 2 leaves c, whose taint it does not
                    # tolerate: no node
                    "not-z1-gen-gt-2": _with_spec(pod("not-z1-gen-gt-2"), affinity=_affinity(
                        {"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["z1"]},
                                              gt2["matchExpressions"][0]]})),
                    "no-zone": _with_spec(pod("no-zone"), affinity=_affinity(
                        {"matchExpressions": [{"key": "zone", "operator": "DoesNotExist"}]})),
                    "b-by-lt": _with_spec(pod("b-by-lt"), affinity=_affinity(
                        {"matchExpressions": [{"key": "gen", "operator": "Lt", "values": ["2"]},
                                              {"key": "zone", "operator": "Exists"}]})),
                }
                for obj in pods.values():
                    await _post(kc, ns, obj)
                where = await wait_until(lambda: _placed(kc, ns, ["z1", "tolerates", "any-taint", "b-by-lt"]),
                                         "the pods some node allows bound")
                reasons = {}
                for name, pattern in (("nowhere", r"0/\d+ nodes are available: \d+ node\(s\) didn't match Pod's node affinity/selector\.$"),
                                      ("untolerated", r"1 node\(s\) had untolerated taint \{dedicated: ml\}"),
                                      ("not-z1-gen-gt-2", r"1 node\(s\) had untolerated taint \{dedicated: ml\}"),
                                      ("no-zone", r".")):  # the pool's nodes all have a zone
                    reasons[name] = await wait_until(lambda n=name, p=pattern: _waiting_with(kc, ns, n, p),
                                                     f"{name} waiting with the constraint's reason")
                events = await wait_until(lambda: events_for(kc, ns, "nowhere"), "an Event on the waiting pod")
                return (a, b, c), where, reasons, events, await list_pods(kc, ns)
            finally:
                await delete_org(kc, "d-shared", ["p-shared"])
                await kc.request("DELETE", f"/api/v1/namespaces/{ns}/pods",
                                 {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0})
                await nodes.remove()

    (a, b, c), where, reasons, events, pods = run(go())
    assert where == {"z1": a, "tolerates": c, "any-taint": c, "b-by-lt": b}
    assert all(p["spec"]["nodeName"] != c for p in bound(pods) if p["metadata"]["name"] not in ("tolerates", "any-taint"))
    assert "didn't match Pod's node affinity/selector" in reasons["untolerated"]
    assert any(e["reason"] == "FailedScheduling" and "0/" in e["message"] for e in events)


def test_preferred_node_affinity_places_on_the_best_scored_node_with_room(k8s_cluster: ClusterInfo, ns, sched):
    """kube-scheduler's NodeAffinity score: the weights of the matching preferred terms
    summed. a scores 40, b 30 + 20 = 50, c (tainted, not tolerated) 100: the first pod goes to
    b though a single term weighs most on a; the second, with b full, to a; the third waits,
    as the preferred c is not for it."""
    def preferred(*weighted: tuple[int, dict]) -> dict:
        return {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": w, "preference": {"matchExpressions": [e]}} for w, e in weighted]}}

    prefs = preferred((40, {"key": "zone", "operator": "In", "values": ["z1"]}),
                      (30, {"key": "zone", "operator": "In", "values": ["z2"]}),
                      (20, {"key": "gen", "operator": "Gt", "values": ["2"]}),
                      (100, {"key": "zone", "operator": "In", "values": ["z3"]}))

    async def go():
        async with kube(k8s_cluster) as kc:
            nodes = OwnNodes(kc, ns)
            try:
                a = await nodes.add("a", labels={"zone": "z1", "gen": "1"})
                b = await nodes.add("b", labels={"zone": "z2", "gen": "5"})
                c = await nodes.add("c", labels={"zone": "z3"},
                                    taints=[{"key": "dedicated", "value": "ml", "effect": "NoSchedule"}])
                await create_org(kc, "d-pref", 6, {"p-pref": {"gpus": 6}}, pool=nodes.pool)

                def pod(name):
                    return make_pod(name).ns(ns).project("p-pref").kind("workspace").gpus(2).pool(nodes.pool)

                where = {}
                for name in ("first", "second"):
                    await _post(kc, ns, _with_spec(pod(name), affinity=prefs))
                    where.update(await wait_until(lambda n=name: _placed(kc, ns, [n]), f"{name} bound"))
                await _post(kc, ns, _with_spec(pod("third"), affinity=prefs))
                await wait_until(lambda: _waiting_with(kc, ns, "third", r"."), "the third waiting with a reason")
                return (a, b, c), where, await _pod(kc, ns, "third")
            finally:
                await delete_org(kc, "d-pref", ["p-pref"])
                await kc.request("DELETE", f"/api/v1/namespaces/{ns}/pods",
                                 {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0})
                await nodes.remove()

    (a, b, c), where, third = run(go())
    assert where == {"first": b, "second": a}
    assert not third["spec"].get("nodeName")


def test_daemonset_and_other_schedulers_pods_hold_their_cpu(k8s_cluster: ClusterInfo, ns, sched):
    """A DaemonSet's pod takes 3 of the node's 4 CPUs: a gpupool pod asking 2 waits until it
    is gone; a pod of another scheduler that finished holds nothing."""

    async def go():
        async with kube(k8s_cluster) as kc:
            nodes = OwnNodes(kc, ns)
            ds_path = f"/apis/apps/v1/namespaces/{ns}/daemonsets"
            try:
                node = await nodes.add("ds", cpu="4")
                await create_org(kc, "d-ds", 2, {"p-ds": {"gpus": 2}}, pool=nodes.pool)
                ds = await kc.post(ds_path, {
                    "apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "agent"},
                    "spec": {"selector": {"matchLabels": {"app": "agent"}}, "template": {
                        "metadata": {"labels": {"app": "agent"}},
                        "spec": {"containers": [{"name": "a", "image": "agent"}]}}}})
                # as the DaemonSet controller makes it: bound to the node by name, default scheduler
                await _post(kc, ns, {
                    "apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": "agent-x", "labels": {"app": "agent"}, "ownerReferences": [
                        {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "agent",
                         "uid": ds["metadata"]["uid"], "controller": True}]},
                    "spec": {"nodeName": node, "containers": [
                        {"name": "a", "image": "agent", "resources": {"requests": {"cpu": "3"}}}]}})
                done = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "other-done"},
                        "spec": {"nodeName": node, "schedulerName": "default-scheduler", "containers": [
                            {"name": "a", "image": "x", "resources": {"requests": {"cpu": "4"}}}]}}
                await _post(kc, ns, done)
                # kwok writes a pod on its node Running once: finish it only after that, or
                # kwok's write can turn it back to Running and its 4 CPUs stay held
                await wait_until(lambda: _phase(kc, ns, "other-done", "Running"), "kwok running the pod")
                await kc.patch(f"/api/v1/namespaces/{ns}/pods/other-done/status",
                               {"status": {"phase": "Succeeded"}})
                await wait_until(lambda: _phase(kc, ns, "other-done", "Succeeded"), "the pod finished")
                want = make_pod("wants-2-cpu").ns(ns).project("p-ds").kind("workspace").gpus(1).pool(nodes.pool).obj()
                want["spec"]["containers"][0]["resources"]["requests"] = {"cpu": "2"}
                want["spec"]["containers"][0]["resources"].setdefault("limits", {})["cpu"] = "2"
                await _post(kc, ns, want)
                waiting = await wait_until(lambda: _waiting_with(kc, ns, "wants-2-cpu", "CPU"),
                                           "the pod waiting for CPU")
                first = await _pod(kc, ns, "wants-2-cpu")
                await kc.delete(f"/api/v1/namespaces/{ns}/pods/agent-x",
                                {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0})
                where = await wait_until(lambda: _placed(kc, ns, ["wants-2-cpu"]),
                                         "the pod bound once the DaemonSet's pod is gone")
                return waiting, first, where, node
            finally:
                await delete_org(kc, "d-ds", ["p-ds"])
                try:
                    await kc.delete(f"{ds_path}/agent")
                except ApiError:
                    pass
                await nodes.remove()

    waiting, first, where, node = run(go())
    assert not first["spec"].get("nodeName"), "placed while the DaemonSet's pod held the CPU"
    assert where == {"wants-2-cpu": node}


async def _storage_class(kc, name: str, mode: str) -> None:
    try:
        await kc.post("/apis/storage.k8s.io/v1/storageclasses", {
            "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": name},
            "provisioner": "example.com/local", "volumeBindingMode": mode})
    except ApiError as e:
        if e.status != 409:
            raise


async def _claim(kc, ns: str, name: str, sc: str, volume: str = "") -> None:
    spec: dict = {"accessModes": ["ReadWriteOnce"], "storageClassName": sc,
                  "resources": {"requests": {"storage": "1Gi"}}}
    if volume:
        spec["volumeName"] = volume
    await kc.post(f"/api/v1/namespaces/{ns}/persistentvolumeclaims",
                  {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name}, "spec": spec})


async def _volume_on(kc, ns: str, name: str, claim: str, node: str, sc: str) -> None:
    """What a provisioner and the PV controller do: a PersistentVolume on ``node`` bound to
    the claim, and the claim Bound to it."""
    await kc.post("/api/v1/persistentvolumes", {
        "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"], "storageClassName": sc,
                 "hostPath": {"path": f"/tmp/{name}"},
                 "claimRef": {"namespace": ns, "name": claim},
                 "nodeAffinity": {"required": {"nodeSelectorTerms": [_name_in(node)]}}}})
    path = f"/api/v1/namespaces/{ns}/persistentvolumeclaims/{claim}"
    await kc.patch(path, {"spec": {"volumeName": name}})
    await kc.patch(f"{path}/status", {"status": {"phase": "Bound"}})


def _with_claim(builder, claim: str) -> dict:
    obj = builder.obj()
    obj["spec"]["volumes"] = [*obj["spec"].get("volumes", []), {"name": "data", "persistentVolumeClaim": {"claimName": claim}}]
    return obj


def test_wait_for_first_consumer_claim_gets_the_chosen_node_and_the_pod_binds_once_bound(
        k8s_cluster: ClusterInfo, ns, sched):
    async def go():
        async with kube(k8s_cluster) as kc:
            nodes = OwnNodes(kc, ns)
            sc_wait, sc_now = f"wait-{ns[-8:]}", f"now-{ns[-8:]}"
            pvs = [f"pv-{ns[-8:]}-{i}" for i in range(2)]
            try:
                await nodes.add("a")
                b = await nodes.add("b")
                await create_org(kc, "d-vol", 4, {"p-vol": {"gpus": 4}}, pool=nodes.pool)
                await _storage_class(kc, sc_wait, "WaitForFirstConsumer")
                await _storage_class(kc, sc_now, "Immediate")
                await _claim(kc, ns, "home", sc_wait)
                await _claim(kc, ns, "unbound-now", sc_now)
                await _claim(kc, ns, "on-b", sc_now)
                await _volume_on(kc, ns, pvs[1], "on-b", b, sc_now)

                def pod(name):
                    return make_pod(name).ns(ns).project("p-vol").kind("workspace").gpus(1).pool(nodes.pool)

                await _post(kc, ns, _with_claim(pod("ws"), "home"))
                await _post(kc, ns, _with_claim(pod("immediate"), "unbound-now"))
                await _post(kc, ns, _with_claim(pod("pinned"), "on-b"))
                await _post(kc, ns, _with_claim(pod("no-claim"), "missing"))

                async def selected():
                    pvc = await kc.get(f"/api/v1/namespaces/{ns}/persistentvolumeclaims/home")
                    return (pvc["metadata"].get("annotations") or {}).get("volume.kubernetes.io/selected-node")

                chosen = await wait_until(selected, "the claim annotated with the chosen node")
                before = await _pod(kc, ns, "ws")
                await _volume_on(kc, ns, pvs[0], "home", chosen, sc_wait)
                where = await wait_until(lambda: _placed(kc, ns, ["ws", "pinned", "immediate"]), "the pods bound")
                reasons = {
                    "no-claim": await wait_until(lambda: _waiting_with(
                        kc, ns, "no-claim", 'persistentvolumeclaim "missing" not found'), "no-claim's reason"),
                }
                return chosen, before, where, b, reasons
            finally:
                await delete_org(kc, "d-vol", ["p-vol"])
                await kc.request("DELETE", f"/api/v1/namespaces/{ns}/pods",
                                 {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0})
                for path in [*(f"/api/v1/namespaces/{ns}/persistentvolumeclaims/{c}"
                               for c in ("home", "unbound-now", "on-b")),
                             *(f"/api/v1/persistentvolumes/{pv}" for pv in pvs),
                             *(f"/apis/storage.k8s.io/v1/storageclasses/{sc}" for sc in (sc_wait, sc_now))]:
                    try:  # no controller here removes the protection finalizers
                        await kc.patch(path, {"metadata": {"finalizers": None}})
                        await kc.delete(path)
                    except ApiError:
                        pass
                await nodes.remove()

    chosen, before, where, b, reasons = run(go())
    assert not before["spec"].get("nodeName"), "bound before its claim was"
    assert where["ws"] == chosen, "the pod runs where its volume was provisioned"
    assert where["pinned"] == b, "a bound claim's volume affinity decides the node"
    assert all(reasons.values())


def test_cpu_quota_of_the_project_keeps_work_waiting_with_its_own_reason(k8s_cluster: ClusterInfo, ns, sched):
    async def go():
        async with kube(k8s_cluster) as kc:
            nodes = OwnNodes(kc, ns)
            try:
                await nodes.add("a", gpus=0)
                await create_org(kc, "d-cpuq", 0, {"p-cpuq": {"gpus": 0, "cpu": 2}}, pool=nodes.pool)
                for i in range(3):
                    obj = make_pod(f"cpu-{i}").ns(ns).project("p-cpuq").kind("workspace").pool(nodes.pool).obj()
                    obj["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "1"}, "limits": {"cpu": "1"}}
                    await _post(kc, ns, obj)

                async def settled():
                    pods = await list_pods(kc, ns)
                    waiting = [p for p in pods if not p["spec"].get("nodeName")]
                    cond = waiting and scheduled_false(waiting[0])
                    return len(bound(pods)) == 2 and len(waiting) == 1 and cond and "CPU quota" in cond["message"] and cond
                return await wait_until(settled, "two pods bound, the third waiting at the CPU quota")
            finally:
                await delete_org(kc, "d-cpuq", ["p-cpuq"])
                await nodes.remove()

    cond = run(go())
    assert "project p-cpuq is at its CPU quota (2 of 2 CPUs in use, 1 more asked)" in cond["message"]


def test_a_gang_with_a_topology_key_lands_in_one_domain(k8s_cluster: ClusterInfo, ns, sched):
    """Two racks of two 2-GPU nodes; one node of each rack is half taken. A gang of two
    1-GPU pods that prefers one rack stays in one rack, though the two half-taken nodes (one
    in each rack) are where packing alone would put it."""
    async def go():
        async with kube(k8s_cluster) as kc:
            nodes = OwnNodes(kc, ns)
            try:
                for rack in ("r1", "r2"):
                    for i in range(2):
                        await nodes.add(f"{rack}-{i}", labels={"example.com/rack": rack}, gpus=2)
                await create_org(kc, "d-topo", 8, {"p-topo": {"gpus": 8}}, pool=nodes.pool)
                for rack in ("r1", "r2"):
                    await _post(kc, ns, _with_spec(
                        make_pod(f"half-{rack}").ns(ns).project("p-topo").kind("workspace").gpus(1).pool(nodes.pool),
                        affinity=_affinity(_name_in(nodes.name(f"{rack}-0")))))
                await wait_until(lambda: _placed(kc, ns, ["half-r1", "half-r2"]), "one GPU of each rack taken")
                gang = [make_pod(f"g-{i}").ns(ns).project("p-topo").kind("training").gpus(1).pool(nodes.pool)
                        .gang("g", 2).annotate("gpupool.io/topology-key", "example.com/rack").obj()
                        for i in range(2)]
                for obj in gang:
                    await _post(kc, ns, obj)
                where = await wait_until(lambda: _placed(kc, ns, ["g-0", "g-1"]), "the gang bound")
                racks = {}
                for node in where.values():
                    racks[node] = (await kc.get(f"/api/v1/nodes/{node}"))["metadata"]["labels"]["example.com/rack"]
                return where, racks
            finally:
                await delete_org(kc, "d-topo", ["p-topo"])
                await kc.request("DELETE", f"/api/v1/namespaces/{ns}/pods",
                                 {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0})
                await nodes.remove()

    where, racks = run(go())
    assert len(set(racks.values())) == 1, (where, racks)


def test_the_over_quota_lag_survives_a_scheduler_restart(k8s_cluster: ClusterInfo, ns, sched):
    """Project a runs ahead of its share (lag > 0); the scheduler stops, the work ends, and a
    new scheduler, which sees nothing running, still reports a's lag: it read it back."""
    async def go():
        async with kube(k8s_cluster) as kc:
            nodes = OwnNodes(kc, ns)
            try:
                await nodes.add("a", gpus=2)
                await create_org(kc, "d-relag", 2, {"p-relag-a": {"gpus": 0}, "p-relag-b": {"gpus": 0}},
                                 pool=nodes.pool)
                for i in range(2):
                    await _post(kc, ns, make_pod(f"a-{i}").ns(ns).project("p-relag-a").kind("training").gpus(1)
                                .pool(nodes.pool).annotate("gpupool.io/preemptible", "false")
                                .annotate("gpupool.io/allow-over-quota", "true").obj())
                await wait_until(lambda: _placed(kc, ns, ["a-0", "a-1"]), "project a holds both GPUs")
                # b waits for two GPUs: over-quota work of any kind is reclaimable (decision
                # 0070), but fair-share reclaim keeps a at its share of one, so a stays ahead
                await _post(kc, ns, make_pod("b-0").ns(ns).project("p-relag-b").kind("training").gpus(2)
                            .pool(nodes.pool).obj())

                async def lag_a(since: float = 0.0):
                    st = (await kc.get(f"{GROUP}/projects/p-relag-a")).get("status") or {}
                    at = st.get("overQuotaLagAt")
                    lag = (st.get("overQuotaLagGpuSeconds") or {}).get(nodes.pool, 0)
                    return at and parse_time(at) >= since and lag >= 1 and lag

                before = await wait_until(lag_a, "project a ahead of its share")
                sched.stop()
                await kc.request("DELETE", f"/api/v1/namespaces/{ns}/pods",
                                 {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0})
                await wait_until(lambda: _none_left(kc, ns), "the work gone")
                restarted = time.time()
                sched.start()
                after = await wait_until(lambda: lag_a(restarted), "the new scheduler's status of project a")
                return before, after
            finally:
                await delete_org(kc, "d-relag", ["p-relag-a", "p-relag-b"])
                await nodes.remove()

    before, after = run(go())
    # A scheduler that started from zero would show no lag for a: nothing runs any more.
    assert before >= 1 and after >= 1, (before, after)


async def _none_left(kc, ns):
    return not await list_pods(kc, ns)



def test_fractions_get_the_gpu_the_kubelet_reserved_for_their_slot(k8s_cluster: ClusterInfo, ns, tmp_path):
    """--gpu-reservations: the first fraction on a GPU slot makes a reservation pod there
    (nvidia.com/gpu: 1, bound by nodeName); what its container reports (played here: kwok
    runs no container and has no device plugin) is the GPU every fraction of the slot is given;
    the reservation goes when the slot's last fraction does. That a whole-GPU pod is then never
    given the reserved GPU is the kubelet's device manager's doing: only a real GPU node shows it."""
    from .helpers import SchedulerProcess

    sched = SchedulerProcess(k8s_cluster, tmp_path, args=("--gpu-reservations", "--reservation-namespace", ns))
    sched.start()

    async def go():
        async with kube(k8s_cluster) as kc:
            nodes = OwnNodes(kc, ns)
            try:
                node = await nodes.add("a", gpus=2)
                await create_org(kc, "d-resv", 2, {"p-resv": {"gpus": 2}}, pool=nodes.pool)
                await _post(kc, ns, make_pod("f-1").ns(ns).project("p-resv").kind("workspace").fraction(0.5)
                            .pool(nodes.pool).obj())

                async def reservations():
                    return (await kc.get(f"/api/v1/namespaces/{ns}/pods",
                                         labelSelector="gpupool.io/gpu-reservation"))["items"]

                (resv,) = await wait_until(reservations, "a reservation pod on the fraction's slot")
                first = await _pod(kc, ns, "f-1")
                await kc.patch(f"/api/v1/namespaces/{ns}/pods/{resv['metadata']['name']}",
                               {"metadata": {"annotations": {"gpupool.io/reserved-gpu": "GPU-reserved-1"}}})
                await wait_until(lambda: _placed(kc, ns, ["f-1"]), "the fraction bound")
                await _post(kc, ns, make_pod("f-2").ns(ns).project("p-resv").kind("workspace").fraction(0.25)
                            .pool(nodes.pool).obj())
                await wait_until(lambda: _placed(kc, ns, ["f-2"]), "the second fraction bound")
                cms = [(await kc.get(f"/api/v1/namespaces/{ns}/configmaps/{n}-gpupool"))["data"] for n in ("f-1", "f-2")]
                pods = {n: await _pod(kc, ns, n) for n in ("f-1", "f-2")}
                during = await reservations()
                for n in ("f-1", "f-2"):
                    await kc.delete(f"/api/v1/namespaces/{ns}/pods/{n}",
                                    {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0})
                await wait_until(lambda: _no_reservations(kc, ns), "the reservation deleted with its last fraction")
                return node, resv, first, cms, pods, during
            finally:
                await delete_org(kc, "d-resv", ["p-resv"])
                await nodes.remove()

    try:
        node, resv, first, cms, pods, during = run(go())
    finally:
        sched.stop()
    assert not first["spec"].get("nodeName"), "bound before its reservation had a GPU"
    spec = resv["spec"]
    assert spec["nodeName"] == node and spec["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "1"}
    assert [cm["NVIDIA_VISIBLE_DEVICES"] for cm in cms] == ["GPU-reserved-1"] * 2
    assert [cm["GPUPOOL_GPU_UUID"] for cm in cms] == ["GPU-reserved-1"] * 2
    assert len({p["metadata"]["annotations"]["gpupool.io/gpu-indices"] for p in pods.values()}) == 1
    assert len(during) == 1, "one reservation per GPU slot, shared by its fractions"


async def _no_reservations(kc, ns):
    items = (await kc.get(f"/api/v1/namespaces/{ns}/pods", labelSelector="gpupool.io/gpu-reservation"))["items"]
    return not items
