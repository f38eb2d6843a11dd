"""Which GPU a container gets on a real node (decision 0060): the real node of the test
cluster with two fake GPUs through a device plugin of the kubelet's (``scripts/test-cluster
up --real-node --fake-gpus 2``, scripts/fake-gpu; the GPU is the only mock). The kubelet's
device manager gives a whole-GPU pod its GPU; with ``--gpu-reservations`` a reservation pod
(the fake-gpu image's ``report``) holds the fractions' GPU through the same device manager
and reports its UUID itself. Each container's ``NVIDIA_VISIBLE_DEVICES`` is read inside it."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import pytest

from scheduler.kubernetes.testcluster import REPO, ClusterInfo, TestCluster, apply_crds
from tests.native.conftest import native  # noqa: F401  (fixture)

from .conftest import REAL_NODE_CONTROLLERS
from .helpers import (
    SchedulerProcess,
    create_namespace,
    create_org,
    default_service_account,
    delete_org,
    kube,
    run,
    wait_until,
)
from .realnode import TEST_IMAGE, build_test_image, kubectl

pytestmark = pytest.mark.timeout(900)

GPUS = 2
PRELOAD_SRC = REPO / "native" / "build" / "libgpupool-cuda.so"  # make native
MODEL, MEMORY_MIB = "NVIDIA H100 80GB HBM3", 81559
SHOW = "echo NVIDIA_VISIBLE_DEVICES=$NVIDIA_VISIBLE_DEVICES; exec /bin/busybox sleep 100000"


@pytest.fixture(scope="module")
def gpu_cluster(tmp_path_factory) -> ClusterInfo:
    """A cluster of its own: the real node with two fake GPUs, the busybox test image,
    kube-controller-manager for service accounts and their tokens, gpupool's CRDs; and the
    node's GPUs published by gpupool-node-agent (a file inventory naming the device plugin's
    UUIDs, as NVML would name the real ones)."""
    from tests.conftest import _build_first

    _build_first()
    d = tmp_path_factory.mktemp("gpu-cluster")
    image = build_test_image(d / "busybox.tar")
    with TestCluster(nodes=0, real_node=True, controller_manager=True, fake_gpus=GPUS,
                     controllers=REAL_NODE_CONTROLLERS, image_archives=(image,)) as info:
        asyncio.run(apply_crds(info))
        inventory = _inventory(info)
        inventory.write_text(json.dumps({"gpus": [
            {"index": i, "uuid": f"{info.fake_gpu_uuid_prefix}{i}", "model": MODEL,
             "memory_mib": MEMORY_MIB} for i in range(GPUS)]}))
        _node_agent_once(info, inventory)
        yield info


def _node_agent_once(info: ClusterInfo, inventory) -> None:
    """gpupool-node-agent on the node (in its mount namespace, as its DaemonSet pod would
    be): the GPUs of ``inventory``, the interception library copied to the node's
    /var/lib/gpupool/lib, the shares' counters read from the kubelet's folder of pods."""
    subprocess.run(["nsenter", "-t", str(info.holder_pid), "-m", "-n", sys.executable, "-m",
                    "scheduler.kubernetes.node_agent", "--kubeconfig", str(info.kubeconfig),
                    "--node-name", str(info.real_node), "--inventory", str(inventory),
                    "--preload-src", str(PRELOAD_SRC), "--pods-dir", str(_pods_dir(info)), "--once"],
                   check=True, capture_output=True, cwd=REPO, timeout=120,
                   env={**os.environ, "PYTHONPATH": str(REPO)})


def _inventory(info: ClusterInfo):
    return info.state_dir / "inventory.json"


def _pods_dir(info: ClusterInfo):
    return info.state_dir / "node" / "kubelet" / "pods"  # the node's kubelet --root-dir/pods


def _pod(name: str, project: str, gpus: int = 0, fraction: float | None = None) -> dict:
    """A busybox pod for gpupool-scheduler that prints the GPUs it was given and sleeps."""
    c: dict = {"name": "main", "image": TEST_IMAGE, "imagePullPolicy": "Never",
               "command": ["/bin/busybox", "sh", "-c", SHOW],
               "resources": {"requests": {"cpu": "10m", "memory": "16Mi"},
                             "limits": {"memory": "64Mi"}}}
    ann = {"gpupool.io/project": project, "gpupool.io/kind": "workspace"}
    if gpus:
        c["resources"]["limits"]["nvidia.com/gpu"] = str(gpus)
    if fraction is not None:
        ann["gpupool.io/gpu-fraction"] = str(fraction)
        c["envFrom"] = [{"configMapRef": {"name": f"{name}-gpupool"}}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "annotations": ann},
            "spec": {"schedulerName": "gpupool", "terminationGracePeriodSeconds": 0,
                     "containers": [c]}}


def _reservation_rbac(ns: str) -> list[tuple[str, dict]]:
    """The chart's reservation service account and Role (patch pods), in ``ns``."""
    name = "gpupool-reservation"
    return [
        (f"/api/v1/namespaces/{ns}/serviceaccounts",
         {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}}),
        (f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles",
         {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": name},
          "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["patch"]}]}),
        (f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings",
         {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
          "metadata": {"name": name},
          "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
          "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ns}]}),
    ]  # fmt: skip


async def _namespace(kc, ns: str) -> None:
    """``ns``, with the default service account pods need (kube-controller-manager's)."""
    await create_namespace(kc, ns)
    await default_service_account(kc, ns)


def _gpus_seen(info: ClusterInfo, ns: str, pod: str) -> str:
    """``NVIDIA_VISIBLE_DEVICES`` as the container's own process has it."""
    return kubectl(info, "-n", ns, "exec", pod, "--", "/bin/busybox", "sh", "-c",
                   "echo $NVIDIA_VISIBLE_DEVICES").strip()


def _place(info: ClusterInfo, ns: str, tmp_path, reservations: bool) -> dict:
    """Two 0.25 fractions, running, then a whole-GPU pod, all by gpupool-scheduler on the
    real node; returns each pod (and the reservations) with the GPUs it sees."""
    args = ["--reservation-namespace", ns]
    if reservations:
        args += ["--gpu-reservations", "--reservation-image", str(info.fake_gpu_image),
                 "--reservation-service-account", "gpupool-reservation", "--reservation-command", ""]
    sched = SchedulerProcess(info, tmp_path, args=tuple(args))
    dept, project = f"d-{ns}", f"p-{ns}"

    async def go():
        async with kube(info) as kc:
            await _namespace(kc, ns)
            for path, obj in _reservation_rbac(ns):
                await kc.post(path, obj)
            await create_org(kc, dept, GPUS, {project: {"gpus": GPUS}})
            sched.start()
            try:
                async def running(names):
                    pods = [await kc.get(f"/api/v1/namespaces/{ns}/pods/{n}") for n in names]
                    ok = all((p.get("status") or {}).get("phase") == "Running" for p in pods)
                    return pods if ok else None

                for n in ("frac-a", "frac-b"):
                    await kc.post(f"/api/v1/namespaces/{ns}/pods", _pod(n, project, fraction=0.25))
                fracs = await wait_until(lambda: running(["frac-a", "frac-b"]), "the fractions running",
                                         timeout=180)
                await kc.post(f"/api/v1/namespaces/{ns}/pods", _pod("whole", project, gpus=1))
                (whole,) = await wait_until(lambda: running(["whole"]), "the whole-GPU pod running",
                                            timeout=180)
                resv = (await kc.get(f"/api/v1/namespaces/{ns}/pods",
                                     labelSelector="gpupool.io/gpu-reservation"))["items"]
                cms = {n: (await kc.get(f"/api/v1/namespaces/{ns}/configmaps/{n}-gpupool"))["data"]
                       for n in ("frac-a", "frac-b")}
                seen = {p["metadata"]["name"]: _gpus_seen(info, ns, p["metadata"]["name"])
                        for p in [*fracs, whole]}
                resv_logs = {r["metadata"]["name"]: kubectl(info, "-n", ns, "logs", r["metadata"]["name"])
                             for r in resv}
                return {"pods": {p["metadata"]["name"]: p for p in [*fracs, whole]}, "seen": seen,
                        "cms": cms, "reservations": resv, "reservation_logs": resv_logs}
            finally:
                sched.stop()
                await kc.request("DELETE", f"/api/v1/namespaces/{ns}/pods",
                                 {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0})

                async def gone():
                    return not (await kc.get(f"/api/v1/namespaces/{ns}/pods"))["items"]

                await wait_until(gone, f"the pods of {ns} gone (their GPUs free again)", timeout=120)
                await delete_org(kc, dept, [project])

    try:
        return run(go())
    finally:
        print(f"--- gpupool-scheduler logs ---\n{sched.logs()}")


def test_a_whole_gpu_pod_never_sees_the_gpu_its_nodes_fractions_are_on(gpu_cluster, tmp_path):
    """--gpu-reservations: the fractions' reservation is given a GPU by the kubelet and
    reports it from inside its container; the fractions see that GPU; the whole-GPU pod that
    comes after them is given the other one."""
    info = gpu_cluster
    uuids = [f"{info.fake_gpu_uuid_prefix}{i}" for i in range(GPUS)]
    got = _place(info, "real-gpus-reserved", tmp_path, reservations=True)
    seen, (resv,) = got["seen"], got["reservations"]
    reserved = resv["metadata"]["annotations"]["gpupool.io/reserved-gpu"]
    assert reserved in uuids
    assert resv["spec"]["nodeName"] == info.real_node
    assert f"NVIDIA_VISIBLE_DEVICES={reserved} reserved {reserved}" in got["reservation_logs"][
        resv["metadata"]["name"]]
    assert seen["frac-a"] == seen["frac-b"] == reserved
    assert [got["cms"][n]["NVIDIA_VISIBLE_DEVICES"] for n in ("frac-a", "frac-b")] == [reserved] * 2
    assert seen["whole"] in uuids
    assert seen["whole"] != reserved, "the whole-GPU pod was given the fractions' GPU"
    assert {p["spec"]["nodeName"] for p in got["pods"].values()} == {info.real_node}


def test_without_reservations_a_whole_gpu_pod_can_be_given_the_fractions_gpu(gpu_cluster, tmp_path):
    """Without --gpu-reservations the fractions are pinned to the scheduler's GPU (index 0's
    UUID, as the node agent publishes it) while the device manager knows of no GPU in use:
    the device plugin's preferred allocation (the lowest free device) gives the whole-GPU
    pod that same GPU. This is what the reservations are for."""
    info = gpu_cluster
    got = _place(info, "real-gpus-unreserved", tmp_path, reservations=False)
    seen, pods = got["seen"], got["pods"]
    assert got["reservations"] == []
    assert [pods[n]["metadata"]["annotations"]["gpupool.io/gpu-indices"] for n in ("frac-a", "frac-b")] \
        == ["0", "0"], "the fractions packed on the scheduler's GPU 0"
    assert seen["frac-a"] == seen["frac-b"] == f"{info.fake_gpu_uuid_prefix}0"
    assert seen["whole"] == seen["frac-a"], "expected the collision the reservations prevent"


# ------------------------------------------------------------- a workload's log lines
TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"
LOGGING = ("/bin/busybox mkdir -p /tmp; echo started; echo GPU=$NVIDIA_VISIBLE_DEVICES;"
           " while [ ! -e /tmp/go ]; do /bin/busybox sleep 0.2; done; echo after;"
           " while [ ! -e /tmp/end ]; do /bin/busybox sleep 0.2; done")


def test_a_command_workloads_log_lines_come_from_its_container_through_the_api_server(
        gpu_cluster, tmp_path):
    """A training command submitted as the hub's runner submits it (one pod, placed by
    gpupool-scheduler, a whole GPU from the device plugin) writes lines in a real container;
    the hub's log handler for Kubernetes (``KubernetesMode.workload_log``, what ``gpupool
    logs`` and ``GET /workloads/NAME/log`` call) reads them from the API server, and a follow
    from the returned offset gets only the lines written since."""
    import time

    from hub_ext.backends.kubernetes import KubernetesMode
    from hub_ext.backends.kubernetes_commands import KubernetesCommands
    from hub_ext.config import Gpupool
    from hub_ext.db.tables import WorkloadRow
    from hub_ext.requests.rules import WorkloadRequest
    from hub_ext.schema import make_sessionmaker

    info, ns, name = gpu_cluster, "real-gpus-logs", "cmd-log"
    Session = make_sessionmaker(f"sqlite:///{tmp_path}/hub.db")
    cfg = Gpupool(backend="kubernetes", namespace=ns, kubeconfig=str(info.kubeconfig))
    sched = SchedulerProcess(info, tmp_path)
    req = WorkloadRequest(project="p-log", kind="training", gpu_mode="whole", gpus=1, cpu=0.1,
                          memory_gib=0.0625, command=["/bin/busybox", "sh", "-c", LOGGING])
    with Session() as s:
        s.add(WorkloadRow(name=name, owner="alice", project="p-log", kind="training", spec=req.to_dict(),
                          state="pending", submit_time=time.time()))
        s.commit()

    def state() -> str:
        with Session() as s:
            return s.get(WorkloadRow, name).state

    async def log(offset=None):
        return await KubernetesMode.workload_log(cfg, name, "training", "alice", 100, offset)

    async def go():
        async with kube(info) as kc, kube(info) as hub_kc:
            await _namespace(kc, ns)
            await create_org(kc, "d-log", GPUS, {"p-log": {"gpus": GPUS}})
            runner = KubernetesCommands(hub_kc, Session, ns, poll_s=0.2, default_image=TEST_IMAGE)
            sched.start()
            runner.start()
            try:
                async def two_lines():
                    lines, end = await log()
                    return (lines, end) if len(lines) >= 2 else None

                first, end = await wait_until(two_lines, "the command's first lines", timeout=180)
                pod = (await kc.get(f"/api/v1/namespaces/{ns}/pods/{name}"))
                token = kubectl(info, "-n", ns, "exec", name, "--", "/bin/busybox", "sh", "-c",
                                f"test -e {TOKEN} && echo token || echo none").strip()
                kubectl(info, "-n", ns, "exec", name, "--", "/bin/busybox", "touch", "/tmp/go")

                async def followed():
                    lines, _ = await log(end)
                    return lines or None

                after = await wait_until(followed, "the line written after the first read", timeout=60)
                kubectl(info, "-n", ns, "exec", name, "--", "/bin/busybox", "touch", "/tmp/end")
                await wait_until(_async(lambda: state() == "succeeded"), "the command ended", timeout=120)
                return pod, first, after, token
            finally:
                await runner.stop()
                sched.stop()
                await delete_org(kc, "d-log", ["p-log"])

    try:
        pod, first, after, token = run(go())
    finally:
        print(f"--- gpupool-scheduler logs ---\n{sched.logs()}")
    assert pod["spec"]["nodeName"] == info.real_node
    assert first[0] == "started"
    assert first[1] in {f"GPU={info.fake_gpu_uuid_prefix}{i}" for i in range(GPUS)}
    assert after == ["after"]
    assert token == "none", "a workload's container holds no service-account token"


def _async(pred):
    async def call():
        return pred()
    return call


# ------------------------------------------------------- idle counters of a real fraction
def test_a_fractions_counters_written_in_its_container_reach_the_culler(gpu_cluster, native, tmp_path):  # noqa: F811
    """Three 0.25 fractions made as the hub makes them (``gpu_parts``: the scheduler's
    ConfigMap, the library's mount, the account's emptyDir) run the native tests' CUDA probe
    in real containers, with the interception library that gpupool-node-agent copied to the
    node and the fake driver: one launches kernels, one allocates once, one never touches the
    GPU. The node agent reads their accounts from the kubelet's folder of pods and publishes
    them on the Node; the culler's reader (``ClusterActivity``) gives each workload its own."""
    from hub_ext.backends.kubernetes import ClusterActivity
    from hub_ext.config import Gpupool
    from scheduler.contract import A, gpu_parts
    from scheduler.kubernetes.testcluster import script_path

    from .realnode import PROBE_IMAGE, build_probe_image

    info, ns = gpu_cluster, "real-gpus-idle"
    archive = build_probe_image(tmp_path / "probe.tar", native.probe("dlsym"), native.fake_dir)
    subprocess.run([str(script_path()), "import", "--dir", str(info.state_dir), str(archive)],
                   check=True, capture_output=True, timeout=300)
    runs = {"busy": "/opt/probe dlsym init ctx:0 launch:2", "quiet": "/opt/probe dlsym init ctx:0 alloc:10M",
            "none": "true"}
    sched = SchedulerProcess(info, tmp_path)
    cfg = Gpupool(backend="kubernetes", namespace=ns, kubeconfig=str(info.kubeconfig))

    def share(name: str, script: str) -> dict:
        parts = gpu_parts(name, 0.25)
        ann = {"gpupool.io/project": "p-idle", "gpupool.io/kind": "workspace", A.WORKLOAD: f"wl-{name}",
               **parts.annotations}
        return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "annotations": ann},
                "spec": {"schedulerName": "gpupool", "terminationGracePeriodSeconds": 0,
                         "volumes": parts.volumes,
                         "containers": [{
                             "name": "main", "image": PROBE_IMAGE, "imagePullPolicy": "Never",
                             "command": ["/bin/busybox", "sh", "-c",
                                         f"{script}; echo probe-exit=$?; exec /bin/busybox sleep 100000"],
                             "env": [{"name": k, "value": v} for k, v in sorted(parts.env.items())],
                             "envFrom": parts.env_from, "volumeMounts": parts.mounts,
                             "resources": {"requests": {"cpu": "10m", "memory": "32Mi"},
                                           "limits": {"memory": "128Mi"}}}]}}

    async def go():
        async with kube(info) as kc:
            await _namespace(kc, ns)
            await create_org(kc, "d-idle", GPUS, {"p-idle": {"gpus": GPUS}})
            sched.start()
            try:
                for name, script in runs.items():
                    await kc.post(f"/api/v1/namespaces/{ns}/pods", share(name, script))
                logs = {}
                for name in runs:
                    async def ran(name=name):
                        try:
                            out = kubectl(info, "-n", ns, "logs", name)
                        except AssertionError:  # not started yet
                            return None
                        return out if "probe-exit=" in out else None

                    logs[name] = await wait_until(ran, f"the probe of {name} run", timeout=180)
                pods = {n: await kc.get(f"/api/v1/namespaces/{ns}/pods/{n}") for n in runs}
                _node_agent_once(info, _inventory(info))
                node = await kc.get(f"/api/v1/nodes/{info.real_node}")
                activity = ClusterActivity(cfg)
                await activity.refresh()
                return logs, pods, node, {n: activity(f"wl-{n}") for n in runs}
            finally:
                sched.stop()
                await kc.request("DELETE", f"/api/v1/namespaces/{ns}/pods",
                                 {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0})
                await delete_org(kc, "d-idle", ["p-idle"])

    try:
        logs, pods, node, seen = run(go())
    finally:
        print(f"--- gpupool-scheduler logs ---\n{sched.logs()}")
    for name in runs:
        assert "probe-exit=0" in logs[name], logs[name]
        assert pods[name]["spec"]["nodeName"] == info.real_node
    assert "launch rc=0" in logs["busy"] and "alloc rc=0" in logs["quiet"], logs
    published = json.loads(node["metadata"]["annotations"]["gpupool.io/gpu-activity"])
    assert published[pods["busy"]["metadata"]["uid"]][0] == 16  # launch:2 is 8 calls twice
    assert published[pods["quiet"]["metadata"]["uid"]][:2] == [0, 1]
    assert pods["none"]["metadata"]["uid"] not in published  # never loaded the driver: no account
    assert seen["busy"].launches == 16
    assert (seen["quiet"].launches, seen["quiet"].allocs) == (0, 1)
    assert seen["none"].count == 0


# ------------------------------------------------------------------ two runs on one host
def test_a_second_runs_device_plugin_meets_only_its_own_kubelet(gpu_cluster, tmp_path):
    """The kubelet's folder of device plugins is fixed (/var/lib/kubelet/device-plugins), and
    each run's is on its own namespace's /var/lib: a second run with one fake GPU, started
    beside the first, registers with its own kubelet only, and the first run's node keeps its
    two GPUs, their UUIDs, and the plugin that answers for them, once the second has stopped."""
    first = gpu_cluster
    (tmp_path / "second").mkdir()
    second = TestCluster(nodes=0, real_node=True, fake_gpus=1, state_dir=tmp_path / "second")
    info = second.start()
    try:
        theirs = json.loads(kubectl(info, "get", "node", str(info.real_node), "-o", "json"))
        ours = json.loads(kubectl(first, "get", "node", str(first.real_node), "-o", "json"))
        plugin_log = (tmp_path / "second" / "logs" / "fake-gpu-plugin.log").read_text()
    finally:
        second.stop()
    assert info.fake_gpu_uuid_prefix != first.fake_gpu_uuid_prefix
    assert theirs["status"]["allocatable"]["nvidia.com/gpu"] == "1"
    assert ours["status"]["allocatable"]["nvidia.com/gpu"] == str(GPUS)
    assert f"1 devices {info.fake_gpu_uuid_prefix}0" in plugin_log
    # The first run's plugin still serves its kubelet: a whole-GPU pod gets one of its GPUs.
    got = _place(first, "real-gpus-after-second", tmp_path, reservations=False)
    assert got["seen"]["whole"] in {f"{first.fake_gpu_uuid_prefix}{i}" for i in range(GPUS)}
