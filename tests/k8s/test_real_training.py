"""Claims, training gangs and scheduler restarts on the test cluster's real node
(``scripts/test-cluster up --real-node --fake-gpus 4 --provisioner``): containerd and a
kubelet run the pods, four fake GPUs come from a device plugin of the kubelet's, and a
host-path provisioner (scripts/hostpath-provisioner) makes the volumes of its
``WaitForFirstConsumer`` class as folders of the run's state dir.

- A claim of that class is provisioned on the node gpupool-scheduler chose, a pod writes to
  it, and deleting the claim removes the folder.
- The hub's training controller (``KubernetesTrainings``) runs the tutorial's training as a
  gang of two workers in the chart's workspace image; their checkpoints go to the
  training's claim. carol's in-quota pod reclaims the GPUs; the workers save on SIGTERM;
  when room returns they resume from the saved step and their logs say so.
- gpupool-scheduler killed while it binds a burst of fractions: after its restart every
  pod is bound once and no GPU holds more than it has.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
from collections import defaultdict
from pathlib import Path

import pytest

from gpupool.checkpoint import latest_step
from scheduler.contract import A, request_annotations, waiting_reason, workload_annotations
from scheduler.kubernetes.testcluster import REPO, ClusterInfo, TestCluster, apply_crds, script_path

from .conftest import REAL_NODE_CONTROLLERS
from .helpers import (
    SchedulerProcess,
    bound,
    create_namespace,
    create_org,
    default_service_account,
    delete_org,
    kube,
    run,
    scheduled_false,
    wait_until,
)
from .realnode import TEST_IMAGE, build_test_image, kubectl

pytestmark = pytest.mark.timeout(900)

GPUS = 4
MODEL, MEMORY_MIB = "NVIDIA H100 80GB HBM3", 81559


@pytest.fixture(scope="module")
def node(tmp_path_factory) -> ClusterInfo:
    """A cluster of its own: the real node with four fake GPUs, the host-path provisioner
    and its class, kube-controller-manager (service accounts, the PV binder), the busybox
    test image, gpupool's CRDs, and the GPUs published by gpupool-node-agent (a file
    inventory naming the device plugin's UUIDs)."""
    from tests.conftest import _build_first

    from .test_real_gpus import _node_agent_once

    _build_first(provisioner=True)
    d = tmp_path_factory.mktemp("training-node")
    image = build_test_image(d / "busybox.tar")
    with TestCluster(nodes=0, real_node=True, controller_manager=True, fake_gpus=GPUS, provisioner=True,
                     controllers=REAL_NODE_CONTROLLERS, image_archives=(image,)) as info:
        asyncio.run(apply_crds(info))
        inventory = info.state_dir / "inventory.json"
        inventory.write_text(json.dumps({"gpus": [
            {"index": i, "uuid": f"{info.fake_gpu_uuid_prefix}{i}", "model": MODEL,
             "memory_mib": MEMORY_MIB} for i in range(GPUS)]}))
        _node_agent_once(info, inventory)
        yield info


def _volumes_dir(info: ClusterInfo) -> Path:
    return info.state_dir / "node" / "volumes"  # the provisioner's --dir


def _pod(name: str, project: str, script: str, *, kind: str = "workspace", gpus: int = 0,
         fraction: float | None = None, claim: str = "", owner: str = "") -> dict:
    """A busybox pod for gpupool-scheduler."""
    c: dict = {"name": "main", "image": TEST_IMAGE, "imagePullPolicy": "Never",
               "command": ["/bin/busybox", "sh", "-c", script],
               "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"memory": "64Mi"}}}
    ann = {**request_annotations(project, kind), **workload_annotations(name, owner)}
    spec: dict = {"schedulerName": "gpupool", "terminationGracePeriodSeconds": 0, "containers": [c]}
    if gpus:
        c["resources"]["limits"]["nvidia.com/gpu"] = str(gpus)
    if fraction is not None:
        ann[A.FRACTION] = str(fraction)
        c["envFrom"] = [{"configMapRef": {"name": f"{name}-gpupool"}}]
    if claim:
        c["volumeMounts"] = [{"name": "data", "mountPath": "/data"}]
        spec["volumes"] = [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "annotations": ann}, "spec": spec}


async def _namespace(kc, ns: str) -> None:
    await create_namespace(kc, ns)
    await default_service_account(kc, ns)


async def _running(kc, ns: str, *names: str):
    pods = [await kc.get(f"/api/v1/namespaces/{ns}/pods/{n}") for n in names]
    return pods if all((p.get("status") or {}).get("phase") == "Running" for p in pods) else None


async def _gone(kc, path: str) -> bool:
    from scheduler.kubernetes.client import ApiError

    try:
        await kc.get(path)
    except ApiError as e:
        return e.status == 404
    return False


async def _delete_all_pods(kc, ns: str) -> None:
    await kc.request("DELETE", f"/api/v1/namespaces/{ns}/pods",
                     {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0})

    async def none_left():
        return not (await kc.get(f"/api/v1/namespaces/{ns}/pods"))["items"]

    await wait_until(none_left, f"the pods of {ns} gone (their GPUs free again)", timeout=120)


def _claim(name: str, storage_class: str) -> dict:
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name},
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": storage_class,
                     "resources": {"requests": {"storage": "1Gi"}}}}


# ------------------------------------------------------------------ the host-path provisioner
def test_a_wait_for_first_consumer_claim_is_provisioned_on_the_node_its_pod_was_given(node, tmp_path):
    """The claim waits (no volume) until gpupool-scheduler places its pod; then it names the
    node, the provisioner makes a folder of the run's state dir and a volume pinned to the
    node, the pod writes there; deleting the claim deletes the volume and the folder."""
    info, ns = node, "real-claim"
    sched = SchedulerProcess(info, tmp_path)

    async def go():
        async with kube(info) as kc:
            await _namespace(kc, ns)
            await create_org(kc, "d-claim", GPUS, {"p-claim": {"gpus": 1}})
            claim_path = f"/api/v1/namespaces/{ns}/persistentvolumeclaims/data"
            try:
                sc = await kc.get(f"/apis/storage.k8s.io/v1/storageclasses/{info.storage_class}")
                await kc.post(f"/api/v1/namespaces/{ns}/persistentvolumeclaims",
                              _claim("data", str(info.storage_class)))
                await asyncio.sleep(2)  # the PV binder's passes: a consumer-less claim stays Pending
                before = await kc.get(claim_path)
                sched.start()
                await kc.post(f"/api/v1/namespaces/{ns}/pods", _pod(
                    "writer", "p-claim", "echo written-on-$(/bin/busybox hostname) > /data/out;"
                    " exec /bin/busybox sleep 100000", claim="data"))
                (pod,) = await wait_until(lambda: _running(kc, ns, "writer"), "the writer running", timeout=180)
                claim = await kc.get(claim_path)
                pv = await kc.get(f"/api/v1/persistentvolumes/{claim['spec']['volumeName']}")
                folder = Path(pv["spec"]["hostPath"]["path"])
                written = await wait_until(lambda: _read(folder / "out"), "the pod's file on the node")
                await _delete_all_pods(kc, ns)
                await kc.delete(claim_path)
                await wait_until(lambda: _gone(kc, f"/api/v1/persistentvolumes/{pv['metadata']['name']}"),
                                 "the volume deleted with its claim")
                await wait_until(lambda: _absent(folder), "the volume's folder removed")
                return sc, before, pod, claim, pv, folder, written
            finally:
                sched.stop()
                await delete_org(kc, "d-claim", ["p-claim"])

    try:
        sc, before, pod, claim, pv, folder, written = run(go())
    finally:
        print(f"--- gpupool-scheduler logs ---\n{sched.logs()}")
    assert sc["volumeBindingMode"] == "WaitForFirstConsumer"
    assert before["status"]["phase"] == "Pending" and not before["spec"].get("volumeName")
    assert pod["spec"]["nodeName"] == info.real_node
    assert claim["metadata"]["annotations"]["volume.kubernetes.io/selected-node"] == info.real_node
    assert claim["status"]["phase"] == "Bound"
    assert pv["spec"]["storageClassName"] == info.storage_class
    terms = pv["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"]
    assert terms == [{"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In",
                                            "values": [info.real_node]}]}]
    assert folder.parent == _volumes_dir(info), "the volume lives in the run's state dir"
    assert written == "written-on-writer\n"


async def _read(path: Path) -> str | None:
    try:
        return path.read_text() or None
    except OSError:
        return None


async def _absent(path: Path) -> bool:
    return not path.exists()


# -------------------------------------------------------------------------- training gang
def _tutorial_script() -> str:
    """The training script of docs/tutorials/first-training.md, as the tutorial gives it."""
    text = (REPO / "docs" / "tutorials" / "first-training.md").read_text()
    m = re.search(r"```python\n(.*?)```", text, re.S)
    assert m and "Checkpointer" in m.group(1)
    return m.group(1)


# Each worker keeps its own checkpoints on the training's claim (one folder per rank).
RUN_TUTORIAL = 'export GPUPOOL_CHECKPOINT_DIR="$GPUPOOL_CHECKPOINT_DIR/rank-$RANK"; exec python -c "$TRAIN_PY"'


@pytest.fixture(scope="module")
def workspace_image(node) -> str:
    """The chart's workspace image (scripts/build-images, cached), loaded into the node."""
    from tests.chart.imagelib import build_images

    built = build_images("workspace")["workspace"]
    subprocess.run([str(script_path()), "import", "--dir", str(node.state_dir), str(built.archive)],
                   check=True, capture_output=True, timeout=600)
    return built.image


@pytest.mark.images
def test_a_training_gang_checkpoints_on_its_claim_is_reclaimed_and_resumes_from_the_saved_step(
        node, workspace_image, tmp_path):
    """alice's training (2 workers x 2 GPUs, over quota) runs the tutorial's script in the
    workspace image, checkpointing on its claim; carol's in-quota pod takes the GPUs back;
    the workers save on SIGTERM; the gang waits with the scheduler's reason; when carol's
    pod goes, it runs again and each worker starts at the step it saved."""
    from hub_ext.schema import make_sessionmaker
    from hub_ext.training.db import TrainingRow, add_training
    from hub_ext.training.kubernetes import KubernetesTrainings, checkpoint_claim
    from hub_ext.training.spec import TrainingSpec

    info, ns, name = node, "real-training", "tutorial"
    Session = make_sessionmaker(f"sqlite:///{tmp_path}/hub.db")
    spec = TrainingSpec(name=name, project="p-alice", command=["sh", "-c", RUN_TUTORIAL],
                        env={"TRAIN_PY": _tutorial_script()}, image=workspace_image, gpu=2, workers=2,
                        cpu=0.1, memory_gib=0.5, grace_period_s=30)
    projects = {"p-alice": {"gpus": 0}, "p-carol": {"gpus": 2}}
    sched = SchedulerProcess(info, tmp_path)
    saw: dict = {}

    def row() -> TrainingRow:
        with Session() as s:
            t = s.get(TrainingRow, name)
            s.expunge(t)
            return t

    async def status(want: str) -> bool:
        return row().status == want

    async def go():
        async with kube(info) as kc, kube(info) as ctl_kc:
            await _namespace(kc, ns)
            await create_org(kc, "d-training", GPUS, projects)
            sched.start()
            ctl = KubernetesTrainings(ctl_kc, Session, ns, poll_s=0.2, checkpoint_size="1Gi",
                                      storage_class=str(info.storage_class))
            try:
                with Session() as s:
                    add_training(s, "alice", spec)
                    s.commit()
                ctl.start()
                await wait_until(lambda: status("Running"), "the gang running", timeout=300)
                claim = await kc.get(f"/api/v1/namespaces/{ns}/persistentvolumeclaims/{checkpoint_claim(name)}")
                pv = await kc.get(f"/api/v1/persistentvolumes/{claim['spec']['volumeName']}")
                folder = Path(pv["spec"]["hostPath"]["path"])
                saw.update(claim=claim, pv=pv, folder=folder)

                async def checkpointed():  # the tutorial saves every 100 steps
                    return all((latest_step(folder / f"rank-{r}") or 0) >= 100 for r in range(2))

                await wait_until(checkpointed, "a checkpoint of each worker on the claim", timeout=300)
                saw["first_logs"] = [await ctl.logs(name, r) for r in range(2)]
                # carol's pod, inside her project's quota, needs two of the gang's GPUs
                await kc.post(f"/api/v1/namespaces/{ns}/pods", _pod(
                    "carol-ws", "p-carol", "exec /bin/busybox sleep 100000", gpus=2, owner="carol"))
                await wait_until(lambda: _running(kc, ns, "carol-ws"), "carol's pod running", timeout=300)
                await wait_until(lambda: _requeued(kc, ns, name), "the gang requeued and waiting")
                saw["saved"] = [latest_step(folder / f"rank-{r}") for r in range(2)]
                saw["waiting"] = row()
                await kc.delete(f"/api/v1/namespaces/{ns}/pods/carol-ws")
                await wait_until(lambda: status("Running"), "the gang running again", timeout=300)

                async def resumed():
                    logs = [await ctl.logs(name, r) for r in range(2)]
                    return logs if all(any(line.startswith("starting at step") for line in lg) for lg in logs) \
                        else None

                saw["logs"] = await wait_until(resumed, "each worker's first line after the resume", timeout=180)
                saw["again"] = row()
                await ctl.control(name, "delete")
                await wait_until(lambda: _absent(folder), "the claim's folder removed with the training")
            finally:
                await ctl.stop()
                sched.stop()
                await _delete_all_pods(kc, ns)
                await delete_org(kc, "d-training", list(projects))

    try:
        run(asyncio.wait_for(go(), 840))
    finally:
        print(f"--- gpupool-scheduler logs ---\n{sched.logs()}")
    print(f"saved at the preemption: {saw['saved']}; after the resume: {saw['logs']}")
    claim, pv = saw["claim"], saw["pv"]
    assert claim["spec"]["storageClassName"] == info.storage_class
    assert pv["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"][0]["matchExpressions"][0]["values"] \
        == [info.real_node]
    assert claim["metadata"]["annotations"]["volume.kubernetes.io/selected-node"] == info.real_node
    assert saw["folder"].parent == _volumes_dir(info)
    for lines in saw["first_logs"]:
        assert "starting at step 0" in lines, lines
    waiting = saw["waiting"]
    assert waiting.preemptions == 1 and waiting.status == "Pending", (waiting.status, waiting.reason)
    assert waiting.reason, "the waiting gang shows why"
    for rank, (saved, lines) in enumerate(zip(saw["saved"], saw["logs"], strict=True)):
        assert saved is not None and saved >= 100, saw["saved"]
        assert f"starting at step {saved}" in lines, (rank, saved, lines)
        assert any(line.startswith(f"gpupool.checkpoint: resumed from step {saved} ") for line in lines), lines
    again = saw["again"]
    assert again.status == "Running" and again.preemptions == 1


async def _requeued(kc, ns: str, name: str):
    """The gang's new pods, not bound, with the scheduler's reason."""
    from scheduler.contract import L

    pods, _ = await kc.list_all(f"/api/v1/namespaces/{ns}/pods", labelSelector=f"{L.TRAINING}={name}")
    fresh = [p for p in pods if (p["metadata"].get("annotations") or {}).get(A.RESUMED) == "true"]
    return len(fresh) == 2 and not bound(fresh) and all(waiting_reason(p) for p in fresh)


# ----------------------------------------------------------------------- scheduler restart
def test_a_scheduler_killed_while_binding_a_burst_binds_each_pod_once(node, tmp_path):
    """16 quarter-GPU pods fill the node's four GPUs; gpupool-scheduler is killed (SIGKILL,
    its Lease left taken) once some are bound and the rest are still coming; after its
    restart all 16 are bound once and run, each GPU holds exactly four quarters, and a
    17th pod waits as unschedulable."""
    info, ns, n = node, "real-restart", GPUS * 4
    sched = SchedulerProcess(info, tmp_path)
    path = f"/api/v1/namespaces/{ns}/pods"

    async def go():
        async with kube(info) as kc:
            await _namespace(kc, ns)
            await create_org(kc, "d-restart", GPUS, {"p-restart": {"gpus": GPUS}})
            sched.start()
            try:
                async def create_all():
                    for i in range(n):
                        await kc.post(path, _pod(f"q-{i:02d}", "p-restart", "exec /bin/busybox sleep 100000",
                                                 kind="training", fraction=0.25))
                        await asyncio.sleep(0.1)

                async def bound_count(k: int):
                    pods = (await kc.get(path))["items"]
                    return pods if len(bound(pods)) >= k else None

                creating = asyncio.create_task(create_all())
                await wait_until(lambda: bound_count(2), "the first pods bound", interval=0.05)
                sched.kill()  # binds in flight, the Lease left taken
                sched.start()
                await creating
                await wait_until(lambda: bound_count(n), "every pod bound", timeout=180)
                names = [f"q-{i:02d}" for i in range(n)]
                pods = await wait_until(lambda: _running(kc, ns, *names), "every pod running", timeout=300)
                await kc.post(path, _pod("extra", "p-restart", "exec /bin/busybox sleep 100000",
                                         kind="training", fraction=0.25))
                extra = await wait_until(lambda: _unschedulable(kc, ns, "extra"), "the 17th pod reported waiting")
                cms = {p["metadata"]["name"]: (await kc.get(
                    f"/api/v1/namespaces/{ns}/configmaps/{p['metadata']['name']}-gpupool"))["data"] for p in pods}
                seen = {p["metadata"]["name"]: kubectl(info, "-n", ns, "exec", p["metadata"]["name"], "--",
                                                       "/bin/busybox", "sh", "-c", "echo $GPUPOOL_GPU_INDEX")
                        .strip() for p in pods[:2]}
                return pods, extra, cms, seen
            finally:
                sched.stop()
                await _delete_all_pods(kc, ns)
                await delete_org(kc, "d-restart", ["p-restart"])

    try:
        pods, extra, cms, seen = run(go())
    finally:
        print(f"--- gpupool-scheduler logs ---\n{sched.logs()}")
    assert sched.starts == 2
    # the pods kept coming after the kill: the restarted scheduler bound some of them
    after = (tmp_path / "gpupool-scheduler-2.log").read_text()
    assert int(re.findall(r"'binds': (\d+)", after)[-1]) > 0, after
    use: dict[str, int] = defaultdict(int)
    for p in pods:
        ann, name = p["metadata"]["annotations"], p["metadata"]["name"]
        assert p["spec"]["nodeName"] == ann["gpupool.io/node"] == info.real_node
        assert p["status"]["containerStatuses"][0]["restartCount"] == 0
        use[ann["gpupool.io/gpu-indices"]] += int(ann["gpupool.io/gpu-milli"])
        assert cms[name]["GPUPOOL_GPU_INDEX"] == ann["gpupool.io/gpu-indices"]
    assert use == {str(i): 1000 for i in range(GPUS)}, f"GPUs not held exactly once: {dict(use)}"
    for name, index in seen.items():  # what the container's process was given
        assert index == cms[name]["GPUPOOL_GPU_INDEX"]
    assert not extra["spec"].get("nodeName")
    assert scheduled_false(extra)["reason"] == "Unschedulable"


async def _unschedulable(kc, ns: str, name: str):
    pod = await kc.get(f"/api/v1/namespaces/{ns}/pods/{name}")
    return pod if scheduled_false(pod) else None

