"""A real ``helm install`` of the chart into the local cluster (kube-controller-manager and
kube-scheduler run the Deployments and the DaemonSet on kwok nodes), then, in order:
every object exists and its pods run; a hub built from the chart's own configuration
spawns a workspace pod through GpupoolKubeSpawner that gpupool-scheduler (with the chart's
ServiceAccount and arguments) binds with its ConfigMap, and the chart's activator gets an
inference replica placed the same way; ``helm upgrade`` changes take effect; ``helm
uninstall`` leaves none of the chart's objects (CRDs in crds/ stay, Helm's convention)."""

from __future__ import annotations

import asyncio
import base64
import json
import urllib.request

import pytest
import yaml

from scheduler.kubernetes.client import ApiError
from scheduler.kubernetes.testcluster import ClusterInfo, client_for
from tests.hub.hubclient import HubClient
from tests.k8s.helpers import wait_until

from . import procs
from .chartlib import (
    CHART,
    INSTANCE,
    RELEASE,
    Discovery,
    helm_run,
    sa_kubeconfig,
    values_file,
)
from .conftest import NODES

pytestmark = pytest.mark.slow

NS = "gpupool-system"
ECHO = {"name": "echo", "project": "serving", "command": ["python", "-m", "http.server"],
        "gpu": 0.25, "min_replicas": 1, "image": "python:3.12-slim", "port": 8000}
INSTALL_VALUES = {
    "hub": {"workspaces": {"httpTimeoutSeconds": 20}},
    "activator": {"services": [ECHO]},
}


def run(coro_fn, info: ClusterInfo):
    async def go():
        async with client_for(info) as kc:
            return await coro_fn(kc)

    return asyncio.run(go())


async def _hub_db_volume(kc) -> None:
    """No provisioner here: a hostPath PersistentVolume for the hub's database claim."""
    try:
        await kc.post("/api/v1/persistentvolumes", {
            "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "chart-test-pv"},
            "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                     "persistentVolumeReclaimPolicy": "Retain",
                     "hostPath": {"path": "/tmp/chart-test-pv"}}})  # fmt: skip
    except ApiError as e:
        if e.status != 409:
            raise


@pytest.fixture(scope="module")
def release(helm, chart_cluster: ClusterInfo, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("release")
    run(_hub_db_volume, chart_cluster)
    helm_run(helm, "install", RELEASE, str(CHART), "-n", NS, "--create-namespace",
             "-f", str(values_file(tmp, INSTALL_VALUES)), "--wait", "--timeout", "5m",
             info=chart_cluster)
    yield tmp
    helm_run(helm, "uninstall", RELEASE, "-n", NS, "--wait", info=chart_cluster, check=False)


def _manifest(helm, info) -> list[dict]:
    out = helm_run(helm, "get", "manifest", RELEASE, "-n", NS, info=info).stdout
    return [d for d in yaml.safe_load_all(out) if d]


async def _chart_pods(kc) -> list[dict]:
    return (await kc.get(f"/api/v1/namespaces/{NS}/pods", labelSelector=INSTANCE))["items"]


def _running(p: dict) -> bool:
    return (p["status"].get("phase") == "Running" and bool(p["spec"].get("nodeName"))
            and "deletionTimestamp" not in p["metadata"])


def test_install_creates_every_object_and_kwok_runs_the_pods(helm, chart_cluster, release):
    objs = _manifest(helm, chart_cluster)
    kinds = {o["kind"] for o in objs}
    assert {"Deployment", "DaemonSet", "ServiceAccount", "ClusterRole", "Role", "NetworkPolicy",
            "Department", "Project", "Secret", "ConfigMap", "Service",
            "PersistentVolumeClaim"} <= kinds

    async def go(kc):
        disc = Discovery(kc)
        missing = []
        for o in objs:
            try:
                await kc.get(await disc.path(o, NS))
            except ApiError as e:
                missing.append(f"{o['kind']}/{o['metadata']['name']}: {e}")
        deps = (await kc.get(f"/apis/apps/v1/namespaces/{NS}/deployments"))["items"]
        ds = await kc.get(f"/apis/apps/v1/namespaces/{NS}/daemonsets/gpupool-node-agent")
        pods = await wait_until(lambda: _all_running(kc), "the chart's pods running")
        crds = [await kc.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{n}")
                for n in ("departments.gpupool.io", "projects.gpupool.io")]
        pvc = await kc.get(f"/api/v1/namespaces/{NS}/persistentvolumeclaims/gpupool-hub-db")
        return missing, deps, ds, pods, crds, pvc

    missing, deps, ds, pods, crds, pvc = run(go, chart_cluster)
    assert missing == []
    assert {d["metadata"]["name"]: d["status"].get("readyReplicas") for d in deps} == {
        "gpupool-hub": 1, "gpupool-scheduler": 1, "gpupool-activator": 1}
    assert ds["status"]["numberReady"] == NODES  # one node agent per (kwok) GPU node
    by_component = {}
    for p in pods:
        c = p["metadata"]["labels"]["app.kubernetes.io/component"]
        by_component[c] = by_component.get(c, 0) + 1
    assert by_component == {"hub": 1, "scheduler": 1, "activator": 1, "node-agent": NODES}
    assert pvc["status"]["phase"] == "Bound"
    assert all(c["metadata"]["name"].endswith("gpupool.io") for c in crds)
    if (CHART / "dashboards" / "gpupool.json").exists():
        assert "ConfigMap" in kinds and any(o["metadata"]["name"] == "gpupool-dashboards"
                                            for o in objs)


async def _all_running(kc) -> list[dict] | None:
    pods = await _chart_pods(kc)
    return pods if len(pods) == 3 + NODES and all(map(_running, pods)) else None


async def _configmap_data(kc, name: str) -> dict[str, str]:
    return (await kc.get(f"/api/v1/namespaces/{NS}/configmaps/{name}"))["data"]


def test_hub_workspace_and_inference_replica_bound_by_gpupool_scheduler(chart_cluster, release,
                                                                        tmp_path):
    """Hub, scheduler and activator run here with the chart's configuration and their
    ServiceAccounts' tokens; kwok plays the kubelets."""

    async def setup(kc):
        kcs = {sa: await sa_kubeconfig(kc, chart_cluster, NS, f"gpupool-{sa}", tmp_path / f"{sa}.kc")
               for sa in ("hub", "scheduler", "activator")}
        hub_files = await _configmap_data(kc, "gpupool-hub-config")
        act_files = await _configmap_data(kc, "gpupool-activator")
        secret = (await kc.get(f"/api/v1/namespaces/{NS}/secrets/gpupool-hub"))["data"]
        act_secret = (await kc.get(f"/api/v1/namespaces/{NS}/secrets/gpupool-activator"))["data"]
        dep = await kc.get(f"/apis/apps/v1/namespaces/{NS}/deployments/gpupool-scheduler")
        args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
        return kcs, hub_files, act_files, secret, base64.b64decode(act_secret["hub-token"]).decode(), args

    kcs, hub_files, act_files, secret, act_token, sched_args = run(setup, chart_cluster)
    passwords = {k: base64.b64decode(v).decode() for k, v in secret.items()}
    (tmp_path / "hub").mkdir()
    (tmp_path / "activator").mkdir()
    sched = procs.scheduler(tmp_path, kcs["scheduler"], sched_args).start()
    hub = procs.ChartHub(tmp_path / "hub", hub_files, kcs["hub"], passwords,
                         {"GPUPOOL_ACTIVATOR_TOKEN": act_token})
    act = procs.activator(tmp_path / "activator", kcs["activator"], act_files, NS,
                          f"{hub.url}/services/gpupool/", act_token)
    try:
        hub.start().wait_up()
        act.start()
        alice = HubClient(hub.url).login("alice", passwords["user-password"])
        token = alice.token("alice")
        options = {"project": "nlp", "gpu_mode": "fraction", "gpu_fraction": 0.5, "cpu": 1,
                   "memory_gib": 2, "workspace_kind": "jupyterlab"}
        req = urllib.request.Request(f"{hub.url}/hub/api/users/alice/server", method="POST",
                                     data=json.dumps(options).encode(),
                                     headers={"Authorization": f"token {token}",
                                              "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            assert r.status in (201, 202)

        async def check(kc):
            async def workspace():
                pods = (await kc.get(f"/api/v1/namespaces/{NS}/pods",
                                     labelSelector="component=singleuser-server"))["items"]
                return [p for p in pods if p["spec"].get("nodeName")]

            (ws,) = await wait_until(workspace, "the workspace pod bound by gpupool-scheduler")
            ws_cm = await _configmap_data(kc, ws["metadata"]["annotations"]["gpupool.io/config-map"])

            async def replica():
                pods = (await kc.get(f"/api/v1/namespaces/{NS}/pods",
                                     labelSelector="gpupool.io/inference-service=echo"))["items"]
                return [p for p in pods if p["spec"].get("nodeName")]

            (rep,) = await wait_until(replica, "the inference replica bound by gpupool-scheduler")
            rep_cm = await _configmap_data(kc, f"{rep['metadata']['name']}-gpupool")
            lease = await kc.get(f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/"
                                 "gpupool-scheduler")
            # stopping the server through the hub's API deletes the pod
            stop = urllib.request.Request(f"{hub.url}/hub/api/users/alice/server",
                                          method="DELETE",
                                          headers={"Authorization": f"token {token}"})
            await asyncio.to_thread(urllib.request.urlopen, stop, timeout=60)
            gone = await wait_until(lambda: _gone(kc, ws["metadata"]["name"]),
                                  "the hub to delete the workspace pod")
            return ws, ws_cm, rep, rep_cm, lease, gone

        ws, ws_cm, rep, rep_cm, lease, gone = run(check, chart_cluster)
    except BaseException:
        for p in (sched, hub, act):
            print(f"--- {p.name} ---\n{p.tail()}")
        raise
    finally:
        act.stop()
        hub.stop()
        sched.stop()
    ann = ws["metadata"]["annotations"]
    assert ws["spec"]["schedulerName"] == "gpupool"
    assert ws["spec"]["automountServiceAccountToken"] is False
    assert ann["gpupool.io/project"] == "nlp" and ann["gpupool.io/gpu-milli"] == "500"
    assert ws["metadata"]["labels"]["hub.jupyter.org/username"] == "alice"
    assert {"configMapRef": {"name": ann["gpupool.io/config-map"], "optional": False}} in \
        ws["spec"]["containers"][0]["envFrom"]
    assert ws_cm["GPUPOOL_GPU_MILLI"] == "500"
    assert ws_cm["LD_PRELOAD"] == "/usr/local/lib/gpupool/libgpupool.so"
    assert rep["metadata"]["annotations"]["gpupool.io/gpu-milli"] == "250"
    assert rep_cm["GPUPOOL_GPU_MILLI"] == "250"
    # it ran as the active replica, on the chart's Lease (the chart's Role: get, update)
    assert lease["spec"]["holderIdentity"]
    assert lease["metadata"]["labels"]["app.kubernetes.io/instance"] == RELEASE
    assert gone


async def _gone(kc, name: str) -> bool:
    try:
        await kc.get(f"/api/v1/namespaces/{NS}/pods/{name}")
        return False
    except ApiError as e:
        return e.status == 404


def test_upgrade_changes_take_effect(helm, chart_cluster, release):
    async def state(kc):
        dep = await kc.get(f"/apis/apps/v1/namespaces/{NS}/deployments/gpupool-hub")
        secret = (await kc.get(f"/api/v1/namespaces/{NS}/secrets/gpupool-hub"))["data"]
        return dep["spec"]["template"]["metadata"]["annotations"]["checksum/config"], secret

    checksum, secret = run(state, chart_cluster)
    values = {**INSTALL_VALUES,
              "hub": {"workspaces": {"httpTimeoutSeconds": 20, "maxCpu": 8}},
              "scheduler": {"replicas": 2}}
    org = yaml.safe_load((CHART / "values.yaml").read_text())["organisation"]
    org["departments"][0]["projects"][0]["gpus"] = 2
    values["organisation"] = org
    helm_run(helm, "upgrade", RELEASE, str(CHART), "-n", NS, "--wait", "--timeout", "5m",
             "-f", str(values_file(release, values, "upgrade.yaml")), info=chart_cluster)

    async def after(kc):
        sched = await wait_until(lambda: _ready(kc, "gpupool-scheduler", 2), "2 scheduler replicas")
        nlp = await kc.get("/apis/gpupool.io/v1alpha1/projects/nlp")
        cfg = (await _configmap_data(kc, "gpupool-hub-config"))["gpupool_config.py"]
        new_checksum, new_secret = await state(kc)
        hub_pods = await wait_until(lambda: _hub_pods_with(kc, new_checksum), "the new hub pod")
        return sched, nlp, cfg, new_checksum, new_secret, hub_pods

    sched, nlp, cfg, new_checksum, new_secret, hub_pods = run(after, chart_cluster)
    assert sched["status"]["readyReplicas"] == 2
    assert nlp["spec"]["quotas"]["default"]["gpus"] == 2
    assert "c.Gpupool.max_cpu = 8" in cfg
    assert new_checksum != checksum  # the hub restarts on a configuration change
    assert len(hub_pods) == 1 and _running(hub_pods[0])
    assert new_secret == secret  # generated passwords are kept across upgrades


async def _ready(kc, name: str, n: int):
    d = await kc.get(f"/apis/apps/v1/namespaces/{NS}/deployments/{name}")
    return d if d["status"].get("readyReplicas") == n and d["status"].get("replicas") == n else None


async def _hub_pods_with(kc, checksum: str):
    pods = (await kc.get(f"/api/v1/namespaces/{NS}/pods",
                         labelSelector=f"{INSTANCE},app.kubernetes.io/component=hub"))["items"]
    if len(pods) == 1 and _running(pods[0]) and \
            pods[0]["metadata"]["annotations"].get("checksum/config") == checksum:
        return pods
    return None


def test_uninstall_leaves_nothing_behind(helm, chart_cluster, release):
    async def left(kc):
        disc = Discovery(kc)
        found = []
        for path, _namespaced in await disc.all_listable():
            if path.endswith("/events"):
                continue
            try:
                items = (await kc.get(path, labelSelector=INSTANCE))["items"]
            except ApiError:
                continue
            found += [f"{path}: {i['metadata'].get('namespace', '')}/{i['metadata']['name']}"
                      for i in items]
        return found

    async def nothing(kc):
        return await left(kc) == []

    # the search below finds the release's objects of every kind while it is installed
    before = run(left, chart_cluster)
    for kind in ("/pods:", "/deployments:", "/clusterroles:", "/projects:", "/networkpolicies:",
                 "/persistentvolumeclaims:", "/leases:"):
        assert any(kind in f for f in before), (kind, before)
    helm_run(helm, "uninstall", RELEASE, "-n", NS, "--wait", "--timeout", "5m",
             info=chart_cluster)

    async def go(kc):
        try:
            await wait_until(lambda: nothing(kc), "every object of the release gone")
        except AssertionError:
            raise AssertionError(f"left behind: {await left(kc)}") from None
        return [await kc.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{n}")
                for n in ("departments.gpupool.io", "projects.gpupool.io")]

    crds = run(go, chart_cluster)
    assert len(crds) == 2  # CRDs from crds/ are never deleted by Helm
    assert RELEASE not in helm_run(helm, "list", "-A", "-q", info=chart_cluster).stdout.split()
