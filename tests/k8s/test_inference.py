"""Inference replicas on the local cluster: the controller's KubernetesBackend creates replica
pods that gpupool-scheduler places (kind inference, in quota), scales them up and down,
and shows the core's reason for a replica that cannot be placed. Services the hub publishes
reach an activator and their state comes back, each side following the ConfigMaps by a
watch. Kept small."""

from __future__ import annotations

import asyncio
import sys

import pytest

from hub_ext.schema import make_sessionmaker
from hub_ext.serving.db import InferenceRow
from hub_ext.serving.kubernetes import LABEL, KubernetesBackend, replica_pod
from hub_ext.serving.published import Follower, Publisher
from hub_ext.serving.spec import parse_spec
from inference.controller import Controller
from scheduler.kubernetes.testcluster import ClusterInfo

from .helpers import (
    SchedulerProcess,
    count_reads,
    create_namespace,
    create_org,
    delete_org,
    delete_pods,
    kube,
    list_pods,
    run,
    wait_until,
)

NS = "inference"


def test_replica_pod_manifest():
    spec = parse_spec({"name": "llm", "project": "p", "command": ["serve"], "gpu": 0.25,
                       "port": 9000, "ready_path": "/health"})
    pod = replica_pod(spec, "llm-abc", "ns")
    assert pod["spec"]["schedulerName"] == "gpupool"
    assert pod["metadata"]["annotations"] == {"gpupool.io/project": "p", "gpupool.io/kind": "inference",
                                              "gpupool.io/gpu-fraction": "0.25",
                                              "gpupool.io/config-map": "llm-abc-gpupool",
                                              "gpupool.io/workload": "llm-abc"}
    c = pod["spec"]["containers"][0]
    assert c["envFrom"] == [{"configMapRef": {"name": "llm-abc-gpupool", "optional": False}}]
    assert c["readinessProbe"]["httpGet"] == {"path": "/health", "port": 9000}
    whole = replica_pod(parse_spec({"name": "w", "project": "p", "command": ["s"], "gpu": 2}), "w-1", "ns")
    assert whole["spec"]["containers"][0]["resources"] == {"limits": {"nvidia.com/gpu": "2"}}


@pytest.fixture
def sched(k8s_cluster: ClusterInfo, tmp_path):
    s = SchedulerProcess(k8s_cluster, tmp_path)
    s.start()
    yield s
    s.stop()


def test_replicas_are_placed_scaled_and_explained(k8s_cluster: ClusterInfo, sched):
    """... and the backend follows the replica pods by a watch: one list, no read per pod."""
    async def go():
        async with kube(k8s_cluster) as kc, kube(k8s_cluster) as backend_kc:
            await create_namespace(kc, NS)
            await create_org(kc, "inf-dept", 1.0, {"inf-proj": {"gpus": 1.0}})
            reads = count_reads(backend_kc, lambda path: path.startswith(f"/api/v1/namespaces/{NS}/pods"))
            backend = KubernetesBackend(backend_kc, NS, poll_s=3600)  # only a change of a pod wakes a replica
            controller = Controller(backend, tick_s=0.3)
            controller.start()
            try:
                base = {"name": "llm", "project": "inf-proj", "command": [sys.executable],
                        "gpu": 0.25, "max_replicas": 8, "stable_window_s": 1,
                        "scale_to_zero_after_s": 0}
                svc = controller.put(parse_spec({**base, "min_replicas": 2}))

                async def placed(n):
                    pods = [p for p in await list_pods(kc, NS)
                            if p["metadata"].get("labels", {}).get(LABEL) == "llm"]
                    return len(pods) == n and all(p["spec"].get("nodeName") for p in pods)

                await wait_until(lambda: placed(2), "2 replica pods bound by gpupool-scheduler")
                # 5 x 0.25 > the project's 1 GPU: inference is in quota only, one waits
                controller.put(parse_spec({**base, "min_replicas": 5}))

                async def explained():
                    return any(r.state.value == "pending" and r.reason for r in svc.replicas)

                await wait_until(explained, "a pending replica with the scheduler's reason")
                controller.put(parse_spec({**base, "min_replicas": 0}))
                await wait_until(lambda: placed(0), "scaled to zero: replica pods deleted")
                assert len(reads) == backend.pods.lists == 1
            finally:
                await controller.stop()
                await backend.close()
                await delete_pods(kc, NS)
                await delete_org(kc, "inf-dept", ["inf-proj"])

    run(go())


def test_a_new_activator_adopts_the_replicas_of_one_that_stopped(k8s_cluster: ClusterInfo, sched):
    """A controller stopped with keep_replicas leaves its replica pods running; the next one
    (held until then) adopts those of the services it serves that run their spec, and deletes
    the others: a service gone meanwhile, one whose command changed (replaced by a new pod).
    The adopted service starts no pod of its own."""
    base = {"project": "adopt-proj", "gpu": 0.25, "max_replicas": 2, "scale_to_zero_after_s": 600}
    keep = parse_spec({**base, "name": "keep", "command": [sys.executable], "min_replicas": 2})
    gone = parse_spec({**base, "name": "gone", "command": [sys.executable], "min_replicas": 1})
    moved = parse_spec({**base, "name": "moved", "command": [sys.executable], "min_replicas": 1})
    moved_now = parse_spec({**base, "name": "moved", "command": [sys.executable, "-u"], "min_replicas": 1})

    async def go():
        async with kube(k8s_cluster) as kc:
            await create_namespace(kc, NS)
            await create_org(kc, "adopt-dept", 2.0, {"adopt-proj": {"gpus": 2.0}})

            async def pods() -> dict[str, tuple[str, str]]:
                """uid -> (service, name) of the bound replica pods that are not going."""
                return {p["metadata"]["uid"]: (p["metadata"]["labels"][LABEL], p["metadata"]["name"])
                        for p in await list_pods(kc, NS)
                        if LABEL in p["metadata"].get("labels", {}) and p["spec"].get("nodeName")
                        and not p["metadata"].get("deletionTimestamp")}

            first = Controller(KubernetesBackend(kc, NS), tick_s=0.3)
            second = None
            try:
                first.start()
                for spec in (keep, gone, moved):
                    first.put(spec)
                await wait_until(lambda: _len(pods(), 4), "4 replica pods bound")
                await first.stop(keep_replicas=True)
                await first.backend.close()
                before = await pods()
                assert len(before) == 4  # still running

                backend = KubernetesBackend(kc, NS)
                second = Controller(backend, tick_s=0.3, held=True)
                second.put(keep)
                second.put(moved_now)
                assert await backend.adopt_all(second) == (2, 4)
                second.start()
                kept = {uid for uid, (svc, _) in before.items() if svc == "keep"}

                async def settled():
                    now = await pods()
                    by_svc = sorted(svc for svc, _ in now.values())
                    return by_svc == ["keep", "keep", "moved"] and kept <= set(now) and now

                now = await wait_until(settled, "gone's pod deleted, moved's replaced, keep's kept")
                assert {uid for uid, (svc, _) in now.items() if svc == "keep"} == kept
                (moved_uid,) = [uid for uid, (svc, _) in now.items() if svc == "moved"]
                assert moved_uid not in before
                assert sorted(r.name for r in second.services["keep"].live()) == sorted(
                    name for svc, name in before.values() if svc == "keep")
            finally:
                if second is not None:
                    await second.stop()
                    await second.backend.close()
                await delete_pods(kc, NS)
                await delete_org(kc, "adopt-dept", ["adopt-proj"])

    run(go())


async def _len(listing, n: int) -> bool:
    return len(await listing) == n


def test_published_services_reach_the_activator_by_a_watch(k8s_cluster: ClusterInfo, ns, tmp_path):
    """The hub's row becomes a ConfigMap, the activator's side serves it and writes its state,
    the state comes back to the row; the row removed, the activator drops the service. Each
    side lists the ConfigMaps once and then watches them."""
    Session = make_sessionmaker(f"sqlite:///{tmp_path}/hub.db")
    spec = parse_spec({"name": "pub", "project": "p-pub", "command": ["serve"], "gpu": 0.25,
                       "min_replicas": 0, "max_replicas": 1}).to_dict()
    path = f"/api/v1/namespaces/{ns}/configmaps"

    def row_status() -> dict:
        with Session() as s:
            r = s.get(InferenceRow, "pub")
            return r.status if r is not None else {}

    async def go():
        async with kube(k8s_cluster) as hub_kc, kube(k8s_cluster) as act_kc:
            hub_lists, act_lists = count_reads(hub_kc, path.__eq__), count_reads(act_kc, path.__eq__)
            controller = Controller(KubernetesBackend(act_kc, ns), tick_s=0.3)
            publisher = Publisher(hub_kc, ns, Session)
            follower = Follower(act_kc, ns, controller, set())
            # every 3600 s: only a change of a ConfigMap wakes a side before then; the row
            # below is added before the hub's side starts, so its first look publishes it
            with Session() as s:
                s.add(InferenceRow(name="pub", owner="alice", project="p-pub", spec=spec))
                s.commit()
            sides = [asyncio.ensure_future(publisher.follow(3600)), asyncio.ensure_future(follower.follow(3600))]
            try:
                await wait_until(lambda: _now("pub" in controller.services), "the activator serves it", timeout=60)
                await wait_until(lambda: _now(row_status().get("replicas") == 0), "its state on the hub's row",
                                 timeout=60)
                with Session() as s:
                    s.delete(s.get(InferenceRow, "pub"))
                    s.commit()
                await publisher.sync()  # the hub's rows changed: as its every_s would
                await wait_until(lambda: _now("pub" not in controller.services), "the activator drops it",
                                 timeout=60)
                assert len(hub_lists) == publisher.mirror.lists == 1
                assert len(act_lists) == follower.mirror.lists == 1
            finally:
                for t in sides:
                    t.cancel()
                await asyncio.gather(*sides, return_exceptions=True)
                await controller.stop()

    run(go())


async def _now(v):
    return v


INF_KEY, INF_TOKEN = "AKIAINFK8S0001", "inf-k8s-token-93ab"


def test_published_service_replicas_carry_its_credentials_and_data_sources(k8s_cluster: ClusterInfo, ns,
                                                                           tmp_path):
    """The hub writes the Secret ``NAME-credentials`` from its vault and publishes the
    attachments by name beside the spec; the activator's replica pods reference the Secret
    and mount the data source, no value in a pod or a ConfigMap; the service removed, the
    Secret goes too."""
    import base64

    from hub_ext.attachments import credentials, datasources
    from hub_ext.db.tables import DepartmentRow, ProjectRow
    from scheduler.kubernetes.client import ApiError

    Session = make_sessionmaker(f"sqlite:///{tmp_path}/hub.db")
    vault = credentials.Vault(tmp_path / "key")
    spec = parse_spec({"name": "att-svc", "project": "p-iatt", "command": ["serve"], "gpu": 0.25,
                       "min_replicas": 1, "max_replicas": 1, "credentials": ["s3", "hf"],
                       "datasources": ["weights"]})
    with Session() as s:
        s.add(DepartmentRow(name="d-iatt", gpus=4))
        s.add(ProjectRow(name="p-iatt", department="d-iatt", gpus=1))
        s.flush()
        credentials.create(s, vault, "p-iatt", {"name": "s3", "data": {"AWS_ACCESS_KEY_ID": INF_KEY}}, "admin")
        credentials.create(s, vault, "p-iatt", {"name": "hf", "delivery": "files", "data": {"token": INF_TOKEN}},
                           "admin")
        datasources.create(s, "p-iatt", {"name": "weights", "kind": "pvc", "claim": "weights-ro"}, "admin")
        s.add(InferenceRow(name="att-svc", owner="alice", project="p-iatt", spec=spec.to_dict()))
        s.commit()
    api = f"/api/v1/namespaces/{ns}"

    async def go():
        async with kube(k8s_cluster) as hub_kc, kube(k8s_cluster) as act_kc:
            publisher = Publisher(hub_kc, ns, Session, vault)
            controller = Controller(KubernetesBackend(act_kc, ns, poll_s=0.3, attachments=lambda sp: follower.attachments(sp)),
                                    tick_s=0.3)
            follower = Follower(act_kc, ns, controller, set())
            sides = [asyncio.ensure_future(publisher.follow(0.5)), asyncio.ensure_future(follower.follow(0.5))]
            controller.start()
            try:
                async def replica():
                    pods = [p for p in await list_pods(act_kc, ns)
                            if p["metadata"].get("labels", {}).get(LABEL) == "att-svc"]
                    return pods[0] if pods else None
                pod = await wait_until(replica, "the replica pod", timeout=60)
                secret = await hub_kc.get(f"{api}/secrets/att-svc-credentials")
                cm = await hub_kc.get(f"{api}/configmaps/gpupool-inference-att-svc")
                with Session() as s:
                    s.delete(s.get(InferenceRow, "att-svc"))
                    s.commit()

                async def secret_gone():
                    try:
                        await hub_kc.get(f"{api}/secrets/att-svc-credentials")
                    except ApiError as e:
                        return e.status == 404
                    return False
                await wait_until(secret_gone, "the Secret deleted with the service", timeout=60)
                return pod, secret, cm
            finally:
                for t in sides:
                    t.cancel()
                await asyncio.gather(*sides, return_exceptions=True)
                await controller.stop()

    pod, secret, cm = run(go())
    assert {k: base64.b64decode(v).decode() for k, v in secret["data"].items()} == {
        "s3.AWS_ACCESS_KEY_ID": INF_KEY, "hf.token": INF_TOKEN}
    (ctr,) = pod["spec"]["containers"]
    env = {e["name"]: e for e in ctr["env"]}
    assert env["AWS_ACCESS_KEY_ID"]["valueFrom"]["secretKeyRef"] == {"name": "att-svc-credentials",
                                                                    "key": "s3.AWS_ACCESS_KEY_ID"}
    assert env["GPUPOOL_CREDENTIALS_HF"]["value"] == "/var/run/gpupool/credentials/hf"
    assert env["GPUPOOL_DATA_WEIGHTS"]["value"] == "/data/weights"
    vols = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert vols["cred-hf"]["secret"]["secretName"] == "att-svc-credentials"
    assert vols["data-weights"]["persistentVolumeClaim"] == {"claimName": "weights-ro", "readOnly": True}
    assert "gpupool-preload" in vols  # the fraction's own volume stays
    for value in (INF_KEY, INF_TOKEN):
        assert value not in str(pod) and value not in str(cm)


def test_the_policy_idle_limit_is_published_with_the_service_and_its_stop_comes_back(k8s_cluster: ClusterInfo,
                                                                                        tmp_path):
    """On Kubernetes the chart's activator scales the services: the hub publishes each
    service's policy idle limit beside its spec, the activator's autoscaler gets it, and
    a scale to zero by it comes back in the state the hub copies, as one event."""
    from sqlalchemy import select

    from hub_ext.db.tables import DepartmentRow, EventRow, PolicyRow, ProjectRow
    from hub_ext.schema import make_sessionmaker
    from hub_ext.serving.db import InferenceRow
    from hub_ext.serving.published import (
        Follower,
        Publisher,
        configmap_name,
        idle_limit_of,
        status_of,
    )
    from inference.autoscaler import IdleLimit

    Session = make_sessionmaker(f"sqlite:///{tmp_path}/hub.db")
    spec = parse_spec({"name": "idle-svc", "project": "p-idle", "command": ["serve"], "min_replicas": 0})
    with Session() as s:
        s.add(DepartmentRow(name="d-idle"))
        s.add(ProjectRow(name="p-idle", department="d-idle"))
        s.add(PolicyRow(scope="project", name="p-idle", spec={"idle_timeout_inference_s": 600}))
        s.add(InferenceRow(name="idle-svc", owner="alice", project="p-idle", spec=spec.to_dict()))
        s.commit()
    message = "idle-svc scaled to zero from 1 replica: (the activator's words)"

    def events() -> list[str]:
        with Session() as s:
            return list(s.scalars(select(EventRow.message).where(EventRow.workload == "idle-svc")))

    async def go():
        async with kube(k8s_cluster) as kc:
            await create_namespace(kc, NS)
            publisher, controller = Publisher(kc, NS, Session), Controller(KubernetesBackend(kc, NS), tick_s=3600)
            follower = Follower(kc, NS, controller, set())

            async def seen(side, test, what: str) -> None:  # each side syncs from its watch's copy
                await wait_until(lambda: _now(test(side.published().get("idle-svc"))), what, timeout=60)

            publisher.mirror.start()
            follower.mirror.start()
            try:
                await wait_until(lambda: _now(publisher.mirror.ready and follower.mirror.ready), "both copies listed",
                                 timeout=60)
                await publisher.sync()
                await seen(follower, lambda cm: cm is not None and idle_limit_of(cm) is not None,
                           "the activator's copy has the limit")
                await follower.sync()
                svc = controller.services["idle-svc"]
                assert svc.autoscaler.policy.idle_limit == IdleLimit(600, "project p-idle's policy")
                svc.idle_stop = {"ts": 1.0, "message": message}  # as Service.recommend records it
                for _ in range(2):  # copied twice, recorded once
                    await follower.sync()
                    await seen(publisher, lambda cm: cm is not None and bool(status_of(cm).get("idle_stop")),
                               "the hub's copy has the stop")
                    await publisher.sync()
                assert events() == [message]
                with Session() as s:  # the policy cleared: the activator's service has no limit
                    s.delete(s.get(PolicyRow, ("project", "p-idle")))
                    s.commit()
                await publisher.sync()
                await seen(follower, lambda cm: cm is not None and idle_limit_of(cm) is None,
                           "the activator's copy has no limit")
                await follower.sync()
                assert svc.autoscaler.policy.idle_limit is None
            finally:
                await publisher.mirror.stop()
                await follower.mirror.stop()
                await controller.stop()
                await kc.delete(f"/api/v1/namespaces/{NS}/configmaps/{configmap_name('idle-svc')}")

    run(go())
