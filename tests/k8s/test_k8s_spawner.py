"""GpupoolKubeSpawner: the pod manifest it builds from a gpupool request (unit, KubeSpawner's
own ``get_pod_manifest`` with mock user/hub objects as KubeSpawner's tests do), and that
manifest created on the local cluster and bound by gpupool-scheduler with its ConfigMap."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from hub_ext import humanize
from hub_ext.requests.rules import WorkloadRequest
from scheduler.kubernetes.objects import parse_pod
from scheduler.kubernetes.testcluster import ClusterInfo

from .helpers import bound, create_org, delete_org, kube, list_pods, run, wait_until

pytest.importorskip("kubespawner")

FAKE_KUBECONFIG = """apiVersion: v1
kind: Config
current-context: fake
clusters: [{name: fake, cluster: {server: "https://127.0.0.1:1", insecure-skip-tls-verify: true}}]
users: [{name: fake, user: {token: fake}}]
contexts: [{name: fake, context: {cluster: fake, user: fake}}]
"""


@pytest.fixture
def manifest(tmp_path, monkeypatch):
    """``manifest(req, namespace=..., **GpupoolKubeSpawner config) -> (spawner, pod dict)``.
    KubeSpawner loads a kubeconfig and makes its client when constructed (in a running
    loop); building the manifest needs no server."""
    from kubernetes_asyncio.client import ApiClient
    from kubernetes_asyncio.config import kube_config
    from traitlets.config import Config

    from hub_ext.workspaces.kubernetes import GpupoolKubeSpawner

    (tmp_path / "kubeconfig").write_text(FAKE_KUBECONFIG)
    monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(tmp_path / "kubeconfig"))

    def build(req: WorkloadRequest, namespace: str = "hub", before=(), **cfg):
        c = Config()
        c.KubeSpawner.image = "quay.io/jupyter/base-notebook:2025-01-01"
        c.KubeSpawner.namespace = namespace
        for k, v in cfg.items():
            setattr(c.GpupoolKubeSpawner, k, v)

        async def go():
            sp = GpupoolKubeSpawner(config=c, _mock=True)
            for r in before:  # earlier starts of the same server
                sp.apply_request(r)
            sp.apply_request(req)
            pod = await sp.get_pod_manifest()
            return sp, ApiClient().sanitize_for_serialization(pod)

        return asyncio.run(go())

    return build


def _env(container: dict) -> dict:
    return {e["name"]: e.get("value") for e in container.get("env") or []}


def test_manifest_fraction_jupyterlab(manifest):
    sp, m = manifest(WorkloadRequest(project="nlp", gpu_mode="fraction", gpu_fraction=0.25,
                                     cpu=2, memory_gib=8))
    pod_name = m["metadata"]["name"]
    cm = f"{pod_name}-gpupool"
    ann = {k: v for k, v in m["metadata"]["annotations"].items() if k.startswith("gpupool.io/")}
    assert ann == {
        "gpupool.io/project": "nlp", "gpupool.io/kind": "workspace",
        "gpupool.io/preemptible": "false", "gpupool.io/allow-over-quota": "false",
        "gpupool.io/gpu-fraction": "0.25", "gpupool.io/config-map": cm,
        "gpupool.io/workload": sp.workload, "gpupool.io/owner": sp.user.name,
    }  # fmt: skip
    spec = m["spec"]
    assert spec["schedulerName"] == "gpupool"
    assert spec["volumes"] == [
        {"name": "home", "persistentVolumeClaim": {"claimName": sp.pvc_name}},
        {"name": "gpupool-preload",
         "hostPath": {"path": "/var/lib/gpupool/lib", "type": "DirectoryOrCreate"}},
        {"name": "gpupool-region", "emptyDir": {}},  # the library's account (the node agent reads it)
    ]
    (c,) = spec["containers"]
    assert c["envFrom"] == [{"configMapRef": {"name": cm, "optional": False}}]
    assert c["volumeMounts"] == [
        {"name": "home", "mountPath": "/home/jovyan"},
        {"name": "gpupool-preload", "mountPath": "/usr/local/lib/gpupool", "readOnly": True},
        {"name": "gpupool-region", "mountPath": "/var/run/gpupool/region"},
    ]
    assert c["resources"] == {"limits": {"cpu": 2.0, "memory": 8 * 2**30},
                              "requests": {"cpu": 2.0, "memory": 8 * 2**30}}
    env = _env(c)
    assert env["LD_PRELOAD"] == "/usr/local/lib/gpupool/libgpupool.so"
    assert env["GPUPOOL_SHARED_REGION"] == "/var/run/gpupool/region/account"
    assert env["JUPYTERHUB_DEFAULT_URL"] == "/lab"
    assert sp.storage_pvc_ensure is True
    # gpupool-scheduler reads it as asked
    r = parse_pod(m)
    assert (r.project, r.kind.value, r.demand.gpu_fraction, r.demand.gpus, r.config_map) == (
        "nlp", "workspace", 0.25, 0, cm)
    assert (r.demand.cpu_milli, r.demand.memory_mib) == (2000, 8192)


def test_manifest_whole_gpus_vscode_over_quota(manifest):
    # the same server started before with a fraction: nothing of that request stays
    _, m = manifest(WorkloadRequest(project="vision", gpu_mode="whole", gpus=2,
                                    workspace_kind="vscode", environment="pytorch",
                                    preemptible=True),
                    before=[WorkloadRequest(project="nlp", gpu_fraction=0.5)],
                    environment_images={"pytorch": "example.org/pytorch:1"})
    ann = m["metadata"]["annotations"]
    assert ann["gpupool.io/allow-over-quota"] == ann["gpupool.io/preemptible"] == "true"
    assert "gpupool.io/gpu-fraction" not in ann and "gpupool.io/config-map" not in ann
    (c,) = m["spec"]["containers"]
    assert c["image"] == "example.org/pytorch:1"
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert "envFrom" not in c and "LD_PRELOAD" not in _env(c)
    assert _env(c)["JUPYTERHUB_DEFAULT_URL"] == "/vscode/"
    assert [v["name"] for v in m["spec"]["volumes"]] == ["home"]
    assert parse_pod(m).demand.gpus == 2


def test_vs_code_opens_the_home_trusted_as_in_embedded_mode(manifest, tmp_path):
    """The container's postStart hook writes code-server's configuration where
    CODE_SERVER_CONFIG points and seeds the embedded mode's machine settings in the home,
    keeping a version the user changed. The hook's own command, run by a shell here with
    the home mount path pointed at a folder."""
    import json
    import shutil
    import subprocess

    from hub_ext.workspaces.spawner import VSCODE_MACHINE_SETTINGS

    home = tmp_path / "home"
    sp, m = manifest(WorkloadRequest(project="nlp", gpu_fraction=0.25, workspace_kind="vscode"),
                     home_mount_path=str(home))
    (c,) = m["spec"]["containers"]
    config = _env(c)["CODE_SERVER_CONFIG"]
    hook = c["lifecycle"]["postStart"]["exec"]["command"]
    settings = home / ".local/share/code-server/Machine/settings.json"
    try:
        assert subprocess.run(hook, timeout=30).returncode == 0
        assert Path(config).read_text() == (f"disable-workspace-trust: true\n"
                                            f'app-name: "gpupool {sp.workload} (0.25 GPU)"\n')
        assert json.loads(settings.read_text()) == VSCODE_MACHINE_SETTINGS
        settings.write_text("{}")  # the user's own
        assert subprocess.run(hook, timeout=30).returncode == 0
        assert settings.read_text() == "{}"
    finally:
        shutil.rmtree(Path(config).parent, ignore_errors=True)


def test_manifest_gpu_memory(manifest):
    extra = {"name": "data", "emptyDir": {}}
    _, m = manifest(WorkloadRequest(project="nlp", gpu_mode="memory", gpu_memory_gib=20),
                    volumes=[extra])
    assert [v["name"] for v in m["spec"]["volumes"]] == ["data", "home", "gpupool-preload", "gpupool-region"]
    assert m["metadata"]["annotations"]["gpupool.io/gpu-memory"] == "20480Mi"
    assert parse_pod(m).demand.gpu_memory_mib == 20480


@pytest.mark.slow
def test_spawner_pod_bound_by_scheduler(k8s_cluster: ClusterInfo, ns, sched, manifest):
    """The subclass's manifest, created as KubeSpawner would create it, is placed by
    gpupool-scheduler, which writes the ConfigMap the pod's envFrom names."""
    _, m = manifest(WorkloadRequest(project="p-kspawn", gpu_fraction=0.5, cpu=1, memory_gib=2),
                    namespace=ns)
    cm_name = m["metadata"]["annotations"]["gpupool.io/config-map"]

    async def go():
        async with kube(k8s_cluster) as kc:
            await create_org(kc, "d-kspawn", 8, {"p-kspawn": {"gpus": 1}})
            try:
                for v in m["spec"].get("volumes") or ():  # the home claim, made first as KubeSpawner does
                    if "persistentVolumeClaim" in v:
                        await kc.ensure(f"/api/v1/namespaces/{ns}/persistentvolumeclaims", {
                            "apiVersion": "v1", "kind": "PersistentVolumeClaim",
                            "metadata": {"name": v["persistentVolumeClaim"]["claimName"]},
                            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}})
                await kc.post(f"/api/v1/namespaces/{ns}/pods", m)

                async def placed():
                    return bound(await list_pods(kc, ns))

                (p,) = await wait_until(placed, "the workspace pod bound")
                cm = await kc.get(f"/api/v1/namespaces/{ns}/configmaps/{cm_name}")
                return p, cm
            finally:
                await delete_org(kc, "d-kspawn", ["p-kspawn"])

    p, cm = run(go())
    assert p["metadata"]["annotations"]["gpupool.io/gpu-milli"] == "500"
    assert cm["data"]["GPUPOOL_GPU_MILLI"] == "500"
    assert cm["data"]["LD_PRELOAD"] == "/usr/local/lib/gpupool/libgpupool.so"
    assert cm["metadata"]["ownerReferences"][0]["name"] == p["metadata"]["name"]


class _Store:
    def __init__(self):
        self.saved: dict = {}

    def last_options(self, user: str) -> dict:
        return {}

    def save_options(self, user: str, options: dict) -> None:
        self.saved[user] = options

    def add_workload(self, name: str, owner: str, req, notify: bool, server: str = "") -> None:
        self.rows = {**getattr(self, "rows", {}), name: req}

    def remove_workload(self, name: str) -> None:
        getattr(self, "rows", {}).pop(name, None)


class _Runtime:
    """What the mixin asks the hub's Runtime for: the user's limits and remembered options."""

    def __init__(self, project: str):
        from hub_ext.config import Gpupool
        from hub_ext.requests.rules import Limits

        self.cfg = Gpupool()  # its environments: name -> image
        self.store = _Store()
        self._limits = Limits(projects=(project,), max_gpus=8, vscode=True)

    def limits(self, user: str, *scopes):  # (user, hub scopes) since the governance work
        return self._limits


@pytest.mark.slow
def test_spawner_start_through_kubespawner(k8s_cluster: ClusterInfo, ns, sched, tmp_path,
                                           monkeypatch):
    """The whole start: the mixin's rules, KubeSpawner creates the PVC and the pod, the
    scheduler binds it (kwok runs it), start returns the pod's URL; stop deletes it."""
    from kubernetes_asyncio.config import kube_config
    from traitlets.config import Config

    from hub_ext.workspaces.kubernetes import GpupoolKubeSpawner

    rt = _Runtime("p-kstart")

    class Spawner(GpupoolKubeSpawner):
        gpupool = property(lambda self: rt)

    monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(k8s_cluster.kubeconfig))
    c = Config()
    c.KubeSpawner.image = "busybox"
    c.KubeSpawner.namespace = ns
    c.KubeSpawner.k8s_api_host = k8s_cluster.host
    c.KubeSpawner.k8s_api_ssl_ca_cert = str(k8s_cluster.ca_file)
    c.KubeSpawner.start_timeout = 240

    from prometheus_client import REGISTRY

    def spawns(outcome: str) -> float:
        return REGISTRY.get_sample_value("gpupool_spawn_duration_seconds_count",
                                         {"project": "p-kstart", "outcome": outcome}) or 0

    before = spawns("started")

    async def go():
        async with kube(k8s_cluster) as kc:
            await create_org(kc, "d-kstart", 8, {"p-kstart": {"gpus": 1}})
            sp = Spawner(config=c, _mock=True)
            try:
                sp.user_options = {"project": "p-kstart", "gpu_mode": "fraction",
                                   "gpu_fraction": 0.25, "cpu": 1, "memory_gib": 2}
                url = await asyncio.wait_for(sp.start(), 300)
                pod = await kc.get(f"/api/v1/namespaces/{ns}/pods/{sp.pod_name}")
                cm = await kc.get(f"/api/v1/namespaces/{ns}/configmaps/{sp.pod_name}-gpupool")
                pvc = await kc.get(f"/api/v1/namespaces/{ns}/persistentvolumeclaims/{sp.pvc_name}")
                await sp.stop(now=True)
                gone = not [p for p in await list_pods(kc, ns)
                            if p["metadata"]["name"] == sp.pod_name]
                return url, pod, cm, pvc, gone
            finally:
                await delete_org(kc, "d-kstart", ["p-kstart"])
                for r in list(GpupoolKubeSpawner.reflectors.values()):
                    await r.stop()
                GpupoolKubeSpawner.reflectors.clear()

    url, pod, cm, pvc, gone = run(go())
    assert pod["spec"]["schedulerName"] == "gpupool"
    assert pod["spec"]["nodeName"]
    assert pod["metadata"]["annotations"]["gpupool.io/gpu-milli"] == "250"
    assert cm["data"]["GPUPOOL_GPU_MILLI"] == "250"
    assert pvc["metadata"]["name"]
    assert url.startswith("http://")
    assert gone
    assert rt.store.saved["mock@name"]["gpu_fraction"] == 0.25
    assert spawns("started") == before + 1  # the spawn-duration metric covers this spawner


# ----------------------------------------------------------- fatal errors and the pending reason
def _waiting(reason: str, message: str = "", **cs) -> dict:
    return {"status": {"phase": "Pending", "containerStatuses": [
        {"name": "notebook", "ready": False, "image": "busybox", "imageID": "",
         "restartCount": cs.pop("restarts", 0), "state": {"waiting": {"reason": reason,
                                                                      "message": message}},
         **cs}]}}  # fmt: skip


CRASH = _waiting("CrashLoopBackOff", "back-off 40s restarting failed container",
                 restarts=3, lastState={"terminated": {"exitCode": 1, "reason": "Error"}})
PULL = _waiting("ErrImagePull", 'failed to pull image "busybox:nope": not found')


@pytest.mark.parametrize("pod,expect", [
    (None, None),
    ({"status": {"phase": "Pending"}}, None),
    (_waiting("ContainerCreating"), None),
    (PULL, 'container notebook: ErrImagePull: failed to pull image "busybox:nope": not found'),
    (_waiting("ImagePullBackOff", "Back-off pulling image"),
     "container notebook: ImagePullBackOff: Back-off pulling image"),
    (_waiting("InvalidImageName"), "container notebook: InvalidImageName"),
    (CRASH, "container notebook: CrashLoopBackOff: exited with code 1 (Error), restarted 3 times"),
    ({"status": {"phase": "Failed", "reason": "Evicted", "message": "node out of memory"}},
     "pod failed: node out of memory"),
    ({"status": {"conditions": [{"type": "PodScheduled", "status": "False",
                                 "reason": "InvalidRequest",
                                 "message": "gpupool.io/gpu-fraction: must be in (0, 1)"}]}},
     "gpupool-scheduler rejected the request: gpupool.io/gpu-fraction: must be in (0, 1)"),
])  # fmt: skip
def test_pod_failure(pod, expect):
    from hub_ext.workspaces.kubernetes import pod_failure

    assert pod_failure(pod) == expect


def test_pending_reason():
    from scheduler.contract import waiting_reason as pending_reason

    waiting = {"spec": {}, "status": {"conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
         "message": "project p over its limit"}]}}  # fmt: skip
    assert pending_reason(waiting) == "project p over its limit"
    assert pending_reason({**waiting, "spec": {"nodeName": "n1"}}) is None
    assert pending_reason({"spec": {}, "status": {}}) is None


def _kspawner(k8s_cluster: ClusterInfo, ns: str, project: str, monkeypatch, **cfg):
    """A GpupoolKubeSpawner class and config for ``ns`` whose user may use ``project``."""
    from kubernetes_asyncio.config import kube_config
    from traitlets.config import Config

    from hub_ext.workspaces.kubernetes import GpupoolKubeSpawner

    rt = _Runtime(project)

    class Spawner(GpupoolKubeSpawner):
        gpupool = property(lambda self: rt)

    monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(k8s_cluster.kubeconfig))
    c = Config()
    c.KubeSpawner.image = "busybox"
    c.KubeSpawner.namespace = ns
    c.KubeSpawner.k8s_api_host = k8s_cluster.host
    c.KubeSpawner.k8s_api_ssl_ca_cert = str(k8s_cluster.ca_file)
    c.KubeSpawner.start_timeout = 900  # far longer than the tests wait: they must end sooner
    for k, v in cfg.items():
        setattr(c.GpupoolKubeSpawner, k, v)
    return Spawner, c


async def _stop_reflectors():
    from hub_ext.workspaces.kubernetes import GpupoolKubeSpawner

    for r in list(GpupoolKubeSpawner.reflectors.values()):
        await r.stop()
    GpupoolKubeSpawner.reflectors.clear()


async def _pod_or_none(kc, ns: str, name: str):
    from scheduler.kubernetes.client import ApiError

    try:
        return await kc.get(f"/api/v1/namespaces/{ns}/pods/{name}")
    except ApiError:
        return None


@pytest.mark.slow
@pytest.mark.parametrize("status,reason", [(PULL, "ErrImagePull"), (CRASH, "CrashLoopBackOff")],
                         ids=["image-pull", "crash-loop"])
def test_fatal_pod_error_ends_the_spawn_at_once(k8s_cluster: ClusterInfo, ns, monkeypatch,
                                                status, reason):
    """The pod is bound (by the test) to a Node that no kubelet and no kwok runs; the test
    then reports, as that node's kubelet would, a container that cannot start. The spawn
    ends with that message although start_timeout is 15 minutes."""
    from hub_ext.workspaces.kubernetes import PodFailed

    node = f"no-kubelet-{ns[-8:]}"
    Spawner, c = _kspawner(k8s_cluster, ns, "p-fatal", monkeypatch,
                           gpupool_scheduler_name="nobody-serves-this")

    async def go():
        async with kube(k8s_cluster) as kc:
            await kc.post("/api/v1/nodes", {"apiVersion": "v1", "kind": "Node",
                                            "metadata": {"name": node}})
            sp = Spawner(config=c, _mock=True)
            try:
                sp.user_options = {"project": "p-fatal", "gpu_fraction": 0.25, "cpu": 1,
                                   "memory_gib": 1}
                start = asyncio.ensure_future(sp.start())
                name = sp.pod_name
                await wait_until(lambda: _pod_or_none(kc, ns, name), "the pod created")
                await kc.post(f"/api/v1/namespaces/{ns}/pods/{name}/binding", {
                    "apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
                    "target": {"apiVersion": "v1", "kind": "Node", "name": node}})
                await kc.patch(f"/api/v1/namespaces/{ns}/pods/{name}/status", status)
                try:
                    await asyncio.wait_for(start, 120)
                    failure = None
                except PodFailed as e:
                    failure = str(e)
                await sp.stop(now=True)
                return failure
            finally:
                await _stop_reflectors()
                await kc.delete(f"/api/v1/nodes/{node}")

    failure = run(go())
    assert failure is not None, "the spawn did not fail"
    assert f"cannot start: container notebook: {reason}" in failure


@pytest.mark.slow
def test_progress_shows_the_scheduler_reason(k8s_cluster: ClusterInfo, ns, sched, monkeypatch):
    """A request over the project's limit waits; progress repeats gpupool-scheduler's reason
    (the pod's PodScheduled=False message)."""
    Spawner, c = _kspawner(k8s_cluster, ns, "p-kwait", monkeypatch)

    async def go():
        async with kube(k8s_cluster) as kc:
            await create_org(kc, "d-kwait", 8, {"p-kwait": {"gpus": 0, "limit": 0}})
            sp = Spawner(config=c, _mock=True)
            try:
                sp.user_options = {"project": "p-kwait", "gpu_fraction": 0.5, "cpu": 1,
                                   "memory_gib": 1}
                start = asyncio.ensure_future(sp.start())
                messages = []

                async def follow():
                    async for ev in sp.progress():
                        messages.append(ev["message"])
                        if ev.get("step") == "waiting":
                            return ev["message"]

                waiting = await asyncio.wait_for(follow(), 120)
                pod = await kc.get(f"/api/v1/namespaces/{ns}/pods/{sp.pod_name}")
                start.cancel()
                await sp.stop(now=True)
                return messages, waiting, pod
            finally:
                await delete_org(kc, "d-kwait", ["p-kwait"])
                await _stop_reflectors()

    messages, waiting, pod = run(go())
    assert messages[0].startswith("Submitted JupyterLab to project p-kwait")
    cond = next(x for x in pod["status"]["conditions"] if x["type"] == "PodScheduled")
    assert cond["status"] == "False"
    assert waiting == humanize.waiting(cond["message"], None)
    assert not pod["spec"].get("nodeName")


# ------------------------------------------------------------- credentials and data sources
S3_KEY, S3_SECRET, TOKEN = "AKIAKSPAWNTEST0001", "s3-secret-kspawn-7c2a", "registry-kspawn-e41f"


class _DbRuntime(_Runtime):
    """The parts of the hub's Runtime the attachments need: a real database (credentials
    sealed with a real vault key, data sources, the audit log) and the delivery's vault."""

    def __init__(self, project: str, state_dir):
        from hub_ext.attachments import attach, credentials, datasources
        from hub_ext.db.tables import DepartmentRow, ProjectRow
        from hub_ext.schema import make_sessionmaker

        super().__init__(project)
        self.Session = make_sessionmaker(f"sqlite:///{state_dir}/gpupool.sqlite")
        self.delivery = attach.Delivery(self.Session, credentials.Vault(state_dir / "key"),
                                        state_dir)
        with self.Session() as s:
            s.add(DepartmentRow(name="d-kcred", gpus=8))
            s.add(ProjectRow(name=project, department="d-kcred", gpus=1))
            s.flush()
            credentials.create(s, self.delivery.vault, project, {
                "name": "s3", "data": {"AWS_ACCESS_KEY_ID": S3_KEY,
                                       "AWS_SECRET_ACCESS_KEY": S3_SECRET}}, "admin")
            credentials.create(s, self.delivery.vault, project, {
                "name": "registry", "delivery": "files", "data": {"token": TOKEN}}, "admin")
            datasources.create(s, project, {"name": "imagenet", "kind": "pvc",
                                            "claim": "imagenet-ro"}, "admin")
            s.commit()


@pytest.mark.slow
def test_spawner_delivers_credentials_and_data_sources(k8s_cluster: ClusterInfo, ns, sched,
                                                       tmp_path, monkeypatch):
    """A workspace with an env credential, a files credential and a PVC data source: the
    Secret holds the values, the pod references its keys (secretKeyRef; a secret volume of
    mode 0400) and mounts the claim; the use is audited; no value is in the pod or the
    progress; stop deletes the Secret."""
    import base64

    from sqlalchemy import select

    from hub_ext.db.audit import AuditRow
    from hub_ext.workspaces.kubernetes import GpupoolKubeSpawner
    from scheduler.kubernetes.client import ApiError

    Spawner, c = _kspawner(k8s_cluster, ns, "p-kcred", monkeypatch)
    rt = _DbRuntime("p-kcred", tmp_path)
    Spawner.gpupool = property(lambda self: rt)
    assert issubclass(Spawner, GpupoolKubeSpawner)

    async def go():
        async with kube(k8s_cluster) as kc:
            await create_org(kc, "d-kcred", 8, {"p-kcred": {"gpus": 1}})
            await kc.post(f"/api/v1/namespaces/{ns}/persistentvolumeclaims", {
                "apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "metadata": {"name": "imagenet-ro"},
                "spec": {"accessModes": ["ReadOnlyMany"],
                         "resources": {"requests": {"storage": "1Gi"}}}})
            sp = Spawner(config=c, _mock=True)
            try:
                sp.user_options = {"project": "p-kcred", "gpu_fraction": 0.25, "cpu": 1,
                                   "memory_gib": 1, "credentials": ["s3", "registry"],
                                   "datasources": ["imagenet"]}
                start = sp.start()
                messages = []

                async def follow():
                    async for ev in sp.progress():
                        messages.append(ev)

                follower = asyncio.ensure_future(follow())
                await asyncio.wait_for(start, 300)
                await asyncio.wait_for(follower, 60)
                pod = await kc.get(f"/api/v1/namespaces/{ns}/pods/{sp.pod_name}")
                secret = await kc.get(f"/api/v1/namespaces/{ns}/secrets/{sp.credentials_secret_name}")
                events = (await kc.get(f"/api/v1/namespaces/{ns}/events"))["items"]
                await sp.stop(now=True)
                try:
                    await kc.get(f"/api/v1/namespaces/{ns}/secrets/{sp.credentials_secret_name}")
                    after = "still there"
                except ApiError as e:
                    after = e.status
                return sp.workload, pod, secret, events, messages, after
            finally:
                await delete_org(kc, "d-kcred", ["p-kcred"])
                await _stop_reflectors()

    workload, pod, secret, events, messages, after = run(go())
    assert pod["spec"]["nodeName"]  # placed by gpupool-scheduler, running under kwok
    stored = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    assert stored == {"s3.AWS_ACCESS_KEY_ID": S3_KEY, "s3.AWS_SECRET_ACCESS_KEY": S3_SECRET,
                      "registry.token": TOKEN}
    (ctr,) = pod["spec"]["containers"]
    env = {e["name"]: e for e in ctr["env"]}
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        assert env[var]["valueFrom"]["secretKeyRef"] == {"name": secret["metadata"]["name"],
                                                         "key": f"s3.{var}"}
    assert env["GPUPOOL_CREDENTIALS_REGISTRY"]["value"] == "/var/run/gpupool/credentials/registry"
    assert env["GPUPOOL_DATA_IMAGENET"]["value"] == "/data/imagenet"
    vols = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert vols["cred-registry"]["secret"] == {
        "secretName": secret["metadata"]["name"], "defaultMode": 0o400,
        "items": [{"key": "registry.token", "path": "token"}]}
    assert vols["data-imagenet"]["persistentVolumeClaim"] == {"claimName": "imagenet-ro",
                                                              "readOnly": True}
    assert {"home", "gpupool-preload"} <= set(vols)  # the request's own volumes stay
    mounts = {m["name"]: m for m in ctr["volumeMounts"]}
    assert mounts["data-imagenet"] == {"name": "data-imagenet", "mountPath": "/data/imagenet",
                                       "readOnly": True}
    assert mounts["cred-registry"]["mountPath"] == "/var/run/gpupool/credentials/registry"
    assert mounts["cred-registry"]["readOnly"] is True
    assert after == 404, "the Secret outlived the workspace"
    text = [m.get("message", "") for m in messages]
    assert any("Attached credentials: s3, registry; data sources: imagenet" in m for m in text)
    for value in (S3_KEY, S3_SECRET, TOKEN):
        assert value not in str(pod) and value not in str(messages) and value not in str(events)
    with rt.Session() as s:
        used = [(r.action, r.target, r.details["stage"]) for r in s.scalars(
            select(AuditRow).where(AuditRow.action.like("%.used")).order_by(AuditRow.id))]
        assert all(r.details.get("workload") == workload for r in s.scalars(
            select(AuditRow).where(AuditRow.action.like("%.used"))))
    assert sorted(used) == sorted(
        (a, t, stage) for stage in ("attach", "deliver") for a, t in (
            ("credential.used", "p-kcred/s3"), ("credential.used", "p-kcred/registry"),
            ("datasource.used", "p-kcred/imagenet")))


def test_unknown_attachment_is_a_field_error(tmp_path, monkeypatch, manifest):
    """A credential the project does not have ends the start with the field named; no pod.
    (``manifest``: for its fake kubeconfig, which the spawner loads when constructed.)"""
    from traitlets.config import Config

    from hub_ext.workspaces.kubernetes import GpupoolKubeSpawner

    rt = _DbRuntime("p-kbad", tmp_path)

    class Spawner(GpupoolKubeSpawner):
        gpupool = property(lambda self: rt)

    async def go():
        c = Config()
        c.KubeSpawner.namespace = "hub"
        sp = Spawner(config=c, _mock=True)
        sp.user_options = {"project": "p-kbad", "gpu_fraction": 0.5, "credentials": ["nope"]}
        with pytest.raises(RuntimeError, match="Invalid request: credentials: .*'nope'"):
            sp.start()
        sp.user_options = {"project": "p-kbad", "gpu_fraction": 0.5,
                           "datasources": ["imagenet"]}
        sp.home_mount_path = "/data"
        with pytest.raises(RuntimeError, match="datasources: .*conflicts with /data"):
            sp.start()

    asyncio.run(go())
