"""On Kubernetes the hub is the control plane: ``helm install`` of the chart, then the hub
(the chart's configuration, the chart's ServiceAccount and RBAC) and gpupool-scheduler (the
chart's arguments) run as local processes against the cluster, kwok playing the kubelets.

As project members, through the hub's REST API and CLI: a 2-worker training gang, a
workspace and an inference service become pods bound by gpupool-scheduler, their states
show in REST, the CLI and the admin panel's queue; an in-quota workspace of another project
preempts the training, which shows Preempted, is requeued with raised priority and binds
again with the same checkpoint claim once the workspace stops. The chart's activator (run
here too, with its ServiceAccount) serves the inference services submitted through the hub:
it scales their replicas to zero after their idle time and back on a request, and the admin
panel's queue shows their state."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import subprocess
import sys
import urllib.parse
import urllib.request

import pytest

from hub_ext.cluster.events import bind_time
from scheduler.contract import A, L
from scheduler.kubernetes.client import ApiError
from tests.chart import procs
from tests.chart.chartlib import CHART, RELEASE, helm_run, sa_kubeconfig, values_file
from tests.chart.conftest import chart_cluster, helm  # noqa: F401  (this package's own cluster)
from tests.chart.test_install import NS, _configmap_data, _hub_db_volume, run
from tests.hub.hubclient import HubClient, call
from tests.k8s.helpers import wait_until

pytestmark = pytest.mark.slow

ORG = {
    "create": True, "nodePool": "default", "admins": ["admin"], "users": [],
    "departments": [
        {"name": "research", "gpus": 32, "projects": [
            {"name": "nlp", "gpus": 0, "members": ["alice", "admin"]},
            {"name": "vision", "gpus": 24, "members": ["alice", "carol"]}]},
        {"name": "ops", "gpus": 1, "projects": [{"name": "serving", "gpus": 1, "members": ["alice"]}]},
    ],
}  # fmt: skip
VALUES = {"hub": {"workspaces": {"httpTimeoutSeconds": 20}}, "organisation": ORG}


@pytest.fixture(scope="module")
def control_plane(helm, chart_cluster, tmp_path_factory):  # noqa: F811
    """The release, then the hub, gpupool-scheduler and the activator with the chart's
    configuration and ServiceAccount tokens. Yields (hub, passwords, activator)."""
    tmp = tmp_path_factory.mktemp("control-plane")
    run(_hub_db_volume, chart_cluster)
    helm_run(helm, "install", RELEASE, str(CHART), "-n", NS, "--create-namespace",
             "-f", str(values_file(tmp, VALUES)), "--wait", "--timeout", "5m", info=chart_cluster)

    async def setup(kc):
        kcs = {sa: await sa_kubeconfig(kc, chart_cluster, NS, f"gpupool-{sa}", tmp / f"{sa}.kc")
               for sa in ("hub", "scheduler", "activator")}
        hub_files = await _configmap_data(kc, "gpupool-hub-config")
        act_files = await _configmap_data(kc, "gpupool-activator")
        secret = (await kc.get(f"/api/v1/namespaces/{NS}/secrets/gpupool-hub"))["data"]
        act_secret = (await kc.get(f"/api/v1/namespaces/{NS}/secrets/gpupool-activator"))["data"]
        secret = {**secret, "activator-token": act_secret["hub-token"]}
        dep = await kc.get(f"/apis/apps/v1/namespaces/{NS}/deployments/gpupool-scheduler")
        # the in-cluster scheduler, hub and activator stand down: the local copies are tested
        for d in ("gpupool-scheduler", "gpupool-hub", "gpupool-activator"):
            await kc.patch(f"/apis/apps/v1/namespaces/{NS}/deployments/{d}/scale", {"spec": {"replicas": 0}})
        return kcs, hub_files, act_files, secret, dep["spec"]["template"]["spec"]["containers"][0]["args"]

    kcs, hub_files, act_files, secret, args = run(setup, chart_cluster)
    passwords = {k: base64.b64decode(v).decode() for k, v in secret.items()}
    act_token = passwords.pop("activator-token")
    (tmp / "hub").mkdir()
    (tmp / "activator").mkdir()
    sched = procs.scheduler(tmp, kcs["scheduler"], args).start()
    hub = procs.ChartHub(tmp / "hub", hub_files, kcs["hub"], passwords,
                         {"GPUPOOL_ACTIVATOR_TOKEN": act_token})
    act = procs.activator(tmp / "activator", kcs["activator"], act_files, NS,
                          f"{hub.url}/services/gpupool/", act_token)
    try:
        hub.start().wait_up()
        act.start()
        yield hub, passwords, act
    except BaseException:
        for p in (sched, hub, act):
            print(f"--- {p.name} ---\n{p.tail(20000)}")
        raise
    finally:
        act.stop()
        hub.stop()
        sched.stop()
        helm_run(helm, "uninstall", RELEASE, "-n", NS, "--wait", info=chart_cluster, check=False)


def _cli(hub, token: str, *args: str) -> str:
    env = {**os.environ, "GPUPOOL_URL": hub.url, "GPUPOOL_TOKEN": token}
    out = subprocess.run([sys.executable, "-m", "hub_ext.cli", *args], env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def _start_server(hub, token: str, user: str, options: dict) -> None:
    req = urllib.request.Request(f"{hub.url}/hub/api/users/{user}/server", method="POST",
                                 data=json.dumps(options).encode(),
                                 headers={"Authorization": f"token {token}", "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        assert r.status in (201, 202)


def _stop_server(hub, token: str, user: str) -> None:
    req = urllib.request.Request(f"{hub.url}/hub/api/users/{user}/server", method="DELETE",
                                 headers={"Authorization": f"token {token}"})
    urllib.request.urlopen(req, timeout=60)


WHOLE = {"gpu_mode": "whole", "gpus": 8, "cpu": 1, "memory_gib": 2, "workspace_kind": "jupyterlab"}


def test_members_workloads_become_pods_and_a_workspace_preempts_the_training(control_plane, chart_cluster):  # noqa: F811
    hub, passwords, _ = control_plane
    alice = HubClient(hub.url).login("alice", passwords["user-password"]).token("alice")
    carol = HubClient(hub.url).login("carol", passwords["user-password"]).token("carol")

    def training() -> dict:
        status, t = call(hub.url, alice, "GET", "/trainings/gang")
        assert status == 200, t
        return t

    async def pods(kc, selector: str) -> list[dict]:
        return (await kc.get(f"/api/v1/namespaces/{NS}/pods", labelSelector=selector))["items"]

    async def until(what: str, pred):
        async def check():
            return await asyncio.to_thread(pred)
        return await wait_until(check, what, timeout=120)

    async def flow(kc):
        # a 2-worker gang over quota (nlp has none), through the CLI: 16 GPUs on two nodes
        _cli(hub, alice, "training", "submit", "gang", "--project", "nlp", "--gpu", "8", "--workers", "2",
             "--preemptible", "--image", "busybox", "--", "torchrun", "train.py")
        await until("the gang runs", lambda: training()["status"] == "Running")
        gang = await pods(kc, f"{L.TRAINING}=gang")
        assert len(gang) == 2 and all(p["spec"]["nodeName"] for p in gang)
        assert {p["spec"]["schedulerName"] for p in gang} == {"gpupool"}
        claim = await kc.get(f"/api/v1/namespaces/{NS}/persistentvolumeclaims/gang-checkpoints")
        await kc.get(f"/api/v1/namespaces/{NS}/services/gang")
        assert "gang" in _cli(hub, alice, "training", "list") and "Running" in _cli(hub, alice, "training", "list")

        # a workspace (vision, in quota) and an inference service, as members
        _start_server(hub, alice, "alice", {"project": "vision", **WHOLE})

        async def alice_ws():
            return [p for p in await pods(kc, "hub.jupyter.org/username=alice") if p["spec"].get("nodeName")]
        (alice_pod,) = await wait_until(alice_ws, "alice's workspace bound")

        def workspace_state() -> str:
            status, body = call(hub.url, alice, "GET", "/workloads")
            assert status == 200, body
            return next((w["state"] for w in body["items"] if w["owner"] == "alice" and w["kind"] == "workspace"), "")
        await until("alice's workspace running in REST", lambda: workspace_state() == "running")
        listing = _cli(hub, alice, "workspace", "list")
        assert any("vision" in line and "running" in line for line in listing.splitlines()), listing
        status, body = call(hub.url, alice, "POST", "/inferences", {
            "name": "echo", "project": "serving", "command": ["python", "-m", "http.server"], "gpu": 0.25,
            "min_replicas": 1, "image": "python:3.12-slim", "port": 8000})
        assert status in (200, 201, 202), body

        async def replica():
            return [p for p in await pods(kc, f"{L.INFERENCE}=echo") if p["spec"].get("nodeName")]
        (rep,) = await wait_until(replica, "the inference replica bound by gpupool-scheduler")
        assert rep["metadata"]["annotations"][A.GPU_MILLI] == "250"
        assert "echo" in _cli(hub, alice, "inference", "list")

        # carol's in-quota workspace needs a whole node: only the gang's can be taken
        first = {p["metadata"]["uid"] for p in gang}
        _start_server(hub, carol, "carol", {"project": "vision", **WHOLE})
        await until("the gang is preempted", lambda: training()["preemptions"] == 1)

        async def carol_ws():
            return [p for p in await pods(kc, "hub.jupyter.org/username=carol") if p["spec"].get("nodeName")]
        (carol_pod,) = await wait_until(carol_ws, "carol's workspace bound")
        t = training()
        assert "Preempted" in [x["status"] for x in t["transitions"]]
        assert t["status"] == "Pending"

        async def requeued():
            ps = await pods(kc, f"{L.TRAINING}=gang")
            return ps if len(ps) == 2 and not {p["metadata"]["uid"] for p in ps} & first else None
        again = await wait_until(requeued, "the gang created again")
        for p in again:
            assert p["metadata"]["annotations"][A.RESUMED] == "true"
            assert int(p["metadata"]["annotations"][A.PRIORITY]) > int(gang[0]["metadata"]["annotations"][A.PRIORITY])
            assert {"name": "checkpoints", "persistentVolumeClaim": {"claimName": "gang-checkpoints"}} \
                in p["spec"]["volumes"]
        same = await kc.get(f"/api/v1/namespaces/{NS}/persistentvolumeclaims/gang-checkpoints")
        assert same["metadata"]["uid"] == claim["metadata"]["uid"]

        # carol stops: the gang binds again, with the same claim
        await asyncio.sleep(1.1)  # the API's times are whole seconds: her GPU-hours are not 0
        _stop_server(hub, carol, "carol")
        await until("the gang runs again", lambda: training()["status"] == "Running")
        t = training()
        assert [len(p["gpu_indices"]) for p in t["placement"]] == [8, 8]

        # the event log and GPU-hours, as an admin sees them
        admin = HubClient(hub.url).login("admin", passwords["admin-password"]).token("admin")
        ws_name = carol_pod["metadata"]["annotations"][A.WORKLOAD]

        def events(workload: str) -> dict[str, list[dict]]:
            status, body = call(hub.url, admin, "GET", f"/events?workload={urllib.parse.quote(workload)}")
            assert status == 200, body
            out: dict[str, list[dict]] = {}
            for e in body["items"]:
                out.setdefault(e["kind"], []).append(e)
            return out

        await until("carol's workspace released", lambda: "released" in events(ws_name))
        ev = events(ws_name)
        assert ev["placed"][0]["ts"] == bind_time(carol_pod)
        assert {"placed", "preempted", "released"} <= set(events("gang-0"))
        status, usage = call(hub.url, admin, "GET", "/usage?by=user")
        assert status == 200, usage
        # the admin panel's queue page lists the training with its state
        status, page = call(hub.url, admin, "GET", "/services/gpupool/queue", api=False)
        assert status == 200, page
        assert "gang" in page["raw"] and "running" in page["raw"]
        assert alice_pod["metadata"]["annotations"][A.WORKLOAD] in page["raw"]  # her workspace too
        (row,) = [r for r in usage["items"] if r["name"] == "carol"]
        assert row["gpu_hours"] == round(8 * (ev["released"][0]["ts"] - ev["placed"][0]["ts"]) / 3600, 6)
        assert "Running" in _cli(hub, alice, "training", "describe", "gang")

    async def go(kc):
        try:
            await flow(kc)
        except BaseException:
            try:
                print(json.dumps(await pods(kc, ""), indent=1)[-20000:])
            except ApiError:
                pass
            raise

    try:
        run(go, chart_cluster)
    except BaseException:
        print(f"--- hub (without successful GETs) ---\n{hub.notable()}")
        raise


def test_the_charts_activator_scales_a_hub_service_to_zero_and_back(control_plane, chart_cluster):  # noqa: F811
    hub, passwords, act = control_plane
    alice = HubClient(hub.url).login("alice", passwords["user-password"]).token("alice")
    admin = HubClient(hub.url).login("admin", passwords["admin-password"]).token("admin")

    def served() -> dict:
        with urllib.request.urlopen(f"http://127.0.0.1:{act.port}/_status", timeout=10) as r:
            return json.loads(r.read())

    def call_service() -> None:  # held until a replica is ready: kwok's never answers
        try:
            urllib.request.urlopen(urllib.request.Request(
                f"http://127.0.0.1:{act.port}/idle/", headers={"Authorization": f"token {alice}"}),
                timeout=3)
        except OSError:
            pass

    async def flow(kc):
        async def replicas(bound: bool = True) -> list[dict]:
            ps = (await kc.get(f"/api/v1/namespaces/{NS}/pods", labelSelector=f"{L.INFERENCE}=idle"))["items"]
            return [p for p in ps if p["spec"].get("nodeName") or not bound]

        def answers() -> bool:
            try:
                return isinstance(served(), dict)
            except OSError:
                return False
        await wait_until(lambda: asyncio.to_thread(answers), "the activator listening")

        status, body = call(hub.url, alice, "POST", "/inferences", {
            "name": "idle", "project": "serving", "command": ["python", "-m", "http.server"], "gpu": 0.25,
            "min_replicas": 0, "max_replicas": 1, "scale_to_zero_after_s": 20, "stable_window_s": 1,
            "request_timeout_s": 2, "image": "python:3.12-slim", "port": 8000})
        assert status in (200, 201, 202), body
        # served by the chart's activator, without a restart, at zero replicas
        await wait_until(lambda: asyncio.to_thread(lambda: "idle" in served()), "the activator serves it")
        assert served()["idle"]["replicas"] == 0 and await replicas(bound=False) == []

        # a request brings a replica, bound by gpupool-scheduler
        caller = asyncio.ensure_future(asyncio.to_thread(call_service))
        (rep,) = await wait_until(replicas, "a replica bound on a request", timeout=120)
        assert rep["spec"]["schedulerName"] == "gpupool"
        assert rep["metadata"]["annotations"][A.PROJECT] == "serving"
        await caller

        # the admin panel's queue shows the service with its replica
        def queue_shows_a_replica() -> bool:
            status, page = call(hub.url, admin, "GET", "/services/gpupool/queue", api=False)
            assert status == 200, page
            row = next((r for r in page["raw"].split("<tr>") if "<td>idle</td>" in r), "")
            return '<td class="num">1</td>' in row
        await wait_until(lambda: asyncio.to_thread(queue_shows_a_replica), "the queue shows idle's replica")

        # idle: back to zero, the pod deleted by the activator
        await wait_until(lambda: _none(replicas(bound=False)), "scaled to zero after the idle time", timeout=120)
        await wait_until(lambda: asyncio.to_thread(lambda: served()["idle"]["replicas"] == 0), "activator at zero")

        # removed through the hub: the activator stops serving it
        status, body = call(hub.url, alice, "DELETE", "/inferences/idle")
        assert status in (200, 202, 204), body
        await wait_until(lambda: asyncio.to_thread(lambda: "idle" not in served()), "the activator drops it")
        assert "echo" in served()  # the others stay

    run(flow, chart_cluster)


async def _none(listing) -> bool:
    return await listing == []


def test_a_submitted_command_runs_as_a_pod_with_its_credential_and_its_log_comes_from_the_api_server(
        control_plane, chart_cluster):  # noqa: F811
    """``POST /workloads`` of kind inference with a project credential, as a member: the hub
    makes one pod, gpupool-scheduler binds it, REST shows it running; the pod references the
    Secret the hub wrote (no value in the pod); ``GET /workloads/NAME/logs`` asks the API
    server for that pod's log (kwok runs no container: no lines); ``DELETE`` stops it and
    its pod and Secret go."""
    hub, passwords, _ = control_plane
    alice = HubClient(hub.url).login("alice", passwords["user-password"]).token("alice")
    admin = HubClient(hub.url).login("admin", passwords["admin-password"]).token("admin")
    value = "cp-token-6f0e2a"

    def state() -> str:
        status, body = call(hub.url, alice, "GET", "/workloads/cmd-cp")
        return body.get("state", "") if status == 200 else f"http {status}"

    async def flow(kc):
        status, body = call(hub.url, admin, "POST", "/projects/serving/credentials",
                            {"name": "hf", "data": {"HF_TOKEN": value}})
        assert status in (200, 201), body
        status, body = call(hub.url, alice, "POST", "/workloads", {
            "name": "cmd-cp", "kind": "inference", "project": "serving", "gpu_mode": "fraction",
            "gpu_fraction": 0.25, "cpu": 0.5, "memory_gib": 1, "command": ["python", "-c", "print(1)"],
            "credentials": ["hf"]})
        assert status == 201, body
        await wait_until(lambda: asyncio.to_thread(lambda: state() == "running"), "cmd-cp running", timeout=120)
        pod = await kc.get(f"/api/v1/namespaces/{NS}/pods/cmd-cp")
        assert pod["spec"]["nodeName"] and pod["metadata"]["annotations"][A.WORKLOAD] == "cmd-cp"
        env = {e["name"]: e for e in pod["spec"]["containers"][0]["env"]}
        assert env["HF_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "cmd-cp-credentials", "key": "hf.HF_TOKEN"}
        secret = await kc.get(f"/api/v1/namespaces/{NS}/secrets/cmd-cp-credentials")
        assert base64.b64decode(secret["data"]["hf.HF_TOKEN"]).decode() == value
        assert value not in json.dumps(pod)
        status, body = call(hub.url, alice, "GET", "/workloads/cmd-cp/logs?tail=10")
        assert status == 200 and body["lines"] == [], body
        status, body = call(hub.url, alice, "DELETE", "/workloads/cmd-cp")
        assert status == 204, body
        await wait_until(lambda: asyncio.to_thread(lambda: state() == "stopped"), "cmd-cp stopped", timeout=120)

        async def gone(path: str) -> bool:
            try:
                await kc.get(path)
            except ApiError as e:
                return e.status == 404
            return False
        await wait_until(lambda: gone(f"/api/v1/namespaces/{NS}/pods/cmd-cp"), "its pod deleted", timeout=120)
        assert await gone(f"/api/v1/namespaces/{NS}/secrets/cmd-cp-credentials")

    run(flow, chart_cluster)


def test_the_panel_and_kubectl_share_one_organisation_and_the_widget_submits_pods(control_plane, chart_cluster):  # noqa: F811
    """After ``helm install``: a Project applied in the cluster (as kubectl does) shows in the
    REST API and the admin panel; a quota edited as the panel edits it (REST, as an admin)
    lands on the Project object gpupool-scheduler reads; a training submitted from the
    notebook widget becomes pods bound by gpupool-scheduler."""
    from gpupool.widgets import JobLauncher

    hub, passwords, _ = control_plane
    admin = HubClient(hub.url).login("admin", passwords["admin-password"]).token("admin")
    alice = HubClient(hub.url).login("alice", passwords["user-password"]).token("alice")
    group = "/apis/gpupool.io/v1alpha1"

    async def flow(kc):
        await kc.post(f"{group}/projects", {
            "apiVersion": "gpupool.io/v1alpha1", "kind": "Project", "metadata": {"name": "applied"},
            "spec": {"department": "research", "quotas": {"default": {"gpus": 2}}}})

        def listed() -> bool:
            status, body = call(hub.url, admin, "GET", "/projects")
            return status == 200 and any(p["name"] == "applied" and p["gpus"] == 2 for p in body["items"])
        await wait_until(lambda: asyncio.to_thread(listed), "the applied Project in the REST API", timeout=60)
        status, page = call(hub.url, admin, "GET", "/services/gpupool/org", api=False)
        assert status == 200 and "applied" in page["raw"], page

        status, body = call(hub.url, admin, "PATCH", "/projects/applied", {"gpus": 3})
        assert status == 200, body
        obj = await kc.get(f"{group}/projects/applied")
        assert obj["spec"]["quotas"]["default"]["gpus"] == 3
        status, body = call(hub.url, admin, "PATCH", "/projects/applied", {"gpus": -1})
        assert status == 400 and body["error"]["field"] == "gpus", body
        assert (await kc.get(f"{group}/projects/applied"))["spec"]["quotas"]["default"]["gpus"] == 3

        # the notebook widget, as alice would use it in her workspace
        launcher = JobLauncher(url=hub.url, token=alice)
        launcher.name.value, launcher.project.value = "from-widget", "vision"
        launcher.gpu.value, launcher.workers.value = 1, 1
        launcher.command.value = "python train.py"
        job = launcher.submit()
        assert job is not None and job["name"] == "from-widget", launcher.message.value

        async def bound():
            ps = (await kc.get(f"/api/v1/namespaces/{NS}/pods", labelSelector=f"{L.TRAINING}=from-widget"))["items"]
            return [p for p in ps if p["spec"].get("nodeName")]
        (pod,) = await wait_until(bound, "the widget's training bound by gpupool-scheduler", timeout=120)
        assert pod["spec"]["schedulerName"] == "gpupool"
        assert pod["metadata"]["annotations"][A.PROJECT] == "vision"
        status, body = call(hub.url, alice, "DELETE", "/trainings/from-widget")
        assert status in (200, 202, 204), body
        await kc.delete(f"{group}/projects/applied")

    try:
        run(flow, chart_cluster)
    except BaseException:
        print(f"--- hub (without successful GETs) ---\n{hub.notable()}")
        raise
