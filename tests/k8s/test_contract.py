"""The workload contract (scheduler/contract.py) round-trips: what every pod builder writes
is what gpupool-scheduler reads back, and every fractional pod, whatever its kind, mounts the
interception library where the scheduler's ConfigMap points LD_PRELOAD."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hub_ext.requests.rules import WorkloadRequest
from hub_ext.serving.kubernetes import replica_pod
from hub_ext.serving.spec import parse_spec
from hub_ext.training.pods import KubernetesOptions, worker_pod
from hub_ext.training.spec import TrainingSpec
from scheduler.contract import (
    DEFAULT_PRELOAD,
    GPU_RESOURCE,
    PRELOAD,
    A,
    fraction_text,
    gpu_parts,
    request_annotations,
    share_env,
)
from scheduler.embedded.adapter import gpu_env
from scheduler.kubernetes.objects import fraction_config_map, parse_pod
from scheduler.model import GPU, MILLI, Kind, Node, PodPlacement

from .test_k8s_spawner import manifest  # noqa: F401  (the spawner's manifest fixture)

NODE = Node("n1", [GPU(0, "H100", 81559, "GPU-aaaa")], cpu_milli=64000, memory_mib=512000)


def _pod(annotations: dict, container: dict | None = None, name: str = "p") -> dict:
    return {"metadata": {"name": name, "namespace": "ns", "uid": "u1", "annotations": annotations},
            "spec": {"containers": [container or {"name": "c"}]}}


@given(
    project=st.from_regex(r"[a-z][a-z0-9-]{0,20}", fullmatch=True),
    kind=st.sampled_from([k.value for k in Kind]),
    priority=st.none() | st.integers(-1000, 1000),
    preemptible=st.none() | st.booleans(),
    over=st.none() | st.booleans(),
    gang_size=st.none() | st.integers(1, 64),
    pool=st.none() | st.from_regex(r"[a-z][a-z0-9-]{0,10}", fullmatch=True),
    resumed=st.booleans(),
    gpus=st.one_of(st.just(0.0), st.floats(0.001, 0.999), st.integers(1, 8).map(float)),
    mem=st.sampled_from([0, 0, 1024, 20480]),
)
def test_request_annotations_and_gpu_parts_round_trip(project, kind, priority, preemptible, over,
                                                      gang_size, pool, resumed, gpus, mem):
    ann = request_annotations(project, kind, priority=priority, preemptible=preemptible,
                              allow_over_quota=over, gang="g" if gang_size else None,
                              gang_size=gang_size, node_pool=pool, resumed=resumed)
    parts = gpu_parts("p", gpus, mem)
    ann.update(parts.annotations)
    container = {"name": "c", "resources": {"limits": parts.limits}} if parts.limits else None
    r = parse_pod(_pod(ann, container))
    assert (r.project, r.kind.value, r.priority, r.preemptible, r.allow_over_quota) == (
        project, kind, priority, preemptible, over)
    assert (r.gang_size, r.workload) == ((gang_size, "ns/gang/g") if gang_size else (1, "ns/p"))
    assert (r.node_pool, r.resumed) == (pool, resumed)
    if mem:
        assert (r.demand.gpu_memory_mib, r.demand.gpu_fraction, r.demand.gpus) == (mem, 0, 0)
    elif 0 < gpus < 1:
        # one rounding: the annotation is the milli-GPU the scheduler will give
        assert r.demand.gpu_fraction == float(fraction_text(gpus))
        assert round(r.demand.gpu_fraction * MILLI) == round(gpus * MILLI)
    else:
        assert (r.demand.gpus, r.demand.gpu_fraction) == (int(gpus), 0)
    assert r.config_map == (parts.annotations.get(A.CONFIG_MAP))


def test_share_env_is_one_unit_for_both_schedulers():
    """The embedded scheduler's process environment and gpupool-scheduler's ConfigMap give
    the interception library the same cap (bytes) and compute share (rounded up)."""
    pl = PodPlacement("n1", (0,), 333)
    cm = fraction_config_map(parse_pod(_pod(gpu_parts("p", 0.333).annotations)), pl, NODE)["data"]
    env = gpu_env(NODE, pl, 0, "", "p")
    for key in ("GPUPOOL_MEMORY_LIMIT", "GPUPOOL_COMPUTE_SHARE"):
        assert cm[key] == env[key] == share_env(81559, 333)[key]
    assert cm["GPUPOOL_MEMORY_LIMIT"] == str(81559 * 2**20 * 333 // 1000)
    assert cm["GPUPOOL_COMPUTE_SHARE"] == "34"
    assert share_env(81559, 333, demand_memory_mib=2048)["GPUPOOL_MEMORY_LIMIT"] == str(2048 * 2**20)


def _check_fractional(pod: dict, fraction: float) -> None:
    """The pod asks for ``fraction`` in the contract's words, takes the scheduler's ConfigMap,
    and mounts the library at the path that ConfigMap preloads."""
    r = parse_pod(pod)
    assert r.demand.gpu_fraction == pytest.approx(fraction)
    assert pod["spec"]["schedulerName"] == "gpupool"
    c = pod["spec"]["containers"][0]
    assert {"configMapRef": {"name": r.config_map, "optional": False}} in c["envFrom"]
    assert GPU_RESOURCE not in (c.get("resources") or {}).get("limits", {})
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    vols = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert mounts[PRELOAD.VOLUME] == {"name": PRELOAD.VOLUME, "mountPath": PRELOAD.mount_dir, "readOnly": True}
    assert vols[PRELOAD.VOLUME]["hostPath"]["path"] == PRELOAD.host_dir
    preload = fraction_config_map(r, PodPlacement("n1", (0,), 250), NODE)["data"]["LD_PRELOAD"]
    assert preload == DEFAULT_PRELOAD
    assert preload.startswith(mounts[PRELOAD.VOLUME]["mountPath"] + "/")
    env = {e["name"]: e.get("value") for e in c.get("env", [])}
    assert env.get("LD_PRELOAD", preload) == preload


def test_fractional_workspace_training_and_inference_pods_all_mount_the_library(manifest):  # noqa: F811
    _, ws = manifest(WorkloadRequest(project="p", gpu_mode="fraction", gpu_fraction=0.25))
    # KubeSpawner writes env as a list and envFrom without optional=False defaults
    _check_fractional(ws, 0.25)
    tr = worker_pod(TrainingSpec(name="t", project="p", command=["python", "t.py"], gpu=0.25, workers=2),
                    1, KubernetesOptions(namespace="ns"))
    _check_fractional(tr, 0.25)
    inf = replica_pod(parse_spec({"name": "llm", "project": "p", "command": ["serve"], "gpu": 0.25}),
                      "llm-abc", "ns")
    _check_fractional(inf, 0.25)
    for pod in (ws, tr, inf):
        assert parse_pod(pod).kind in (Kind.WORKSPACE, Kind.TRAINING, Kind.INFERENCE)


def test_whole_gpu_pods_mount_nothing():
    tr = worker_pod(TrainingSpec(name="t", project="p", command=["x"], gpu=2), 0, KubernetesOptions(namespace="ns"))
    c = tr["spec"]["containers"][0]
    assert c["resources"]["limits"] == {GPU_RESOURCE: "2"}
    assert "envFrom" not in c and "volumes" not in tr["spec"]
    assert parse_pod(tr).demand.gpus == 2


def test_a_pod_marked_by_the_scheduler_reads_as_preempted():
    from scheduler.contract import preempted
    from scheduler.kubernetes.objects import preemption_mark

    mark = preemption_mark("project p takes back its quota")["status"]["conditions"][0]
    assert preempted({"status": {"conditions": [{"type": "Ready", "status": "True"}, mark]}})
    assert not preempted({"status": {"conditions": [{**mark, "reason": "DeletionByTaintManager"}]}})
    assert not preempted({"status": {}}) and not preempted(None)


def test_training_workers_carry_the_topology_key_the_scheduler_reads():
    spec = TrainingSpec(name="t", project="p", command=["x"], gpu=1, workers=2)
    pod = worker_pod(spec, 0, KubernetesOptions(namespace="ns", topology_key="example.com/rack"))
    assert parse_pod(pod).topology_key == "example.com/rack"
    assert parse_pod(worker_pod(spec, 0, KubernetesOptions(namespace="ns"))).topology_key is None


def test_trainings_and_services_without_an_image_run_the_workload_image():
    """The workspace image (gpupool.checkpoint, numpy), or the hub's configured one."""
    from hub_ext.images import WORKLOAD_IMAGE

    spec = TrainingSpec(name="t", project="p", command=["x"], gpu=1)
    svc = parse_spec({"name": "llm", "project": "p", "command": ["serve"], "gpu": 1})

    def image(pod: dict) -> str:
        return pod["spec"]["containers"][0]["image"]

    assert image(worker_pod(spec, 0, KubernetesOptions(namespace="ns"))) == WORKLOAD_IMAGE
    assert image(replica_pod(svc, "llm-1", "ns")) == WORKLOAD_IMAGE
    assert image(worker_pod(spec, 0, KubernetesOptions(namespace="ns", default_image="own:1"))) == "own:1"
    assert image(replica_pod(svc, "llm-1", "ns", default_image="own:1")) == "own:1"
    spec = TrainingSpec(name="t", project="p", command=["x"], gpu=1, image="mine:2")
    svc = parse_spec({"name": "llm", "project": "p", "command": ["serve"], "gpu": 1, "image": "mine:2"})
    assert image(worker_pod(spec, 0, KubernetesOptions(namespace="ns", default_image="own:1"))) == "mine:2"
    assert image(replica_pod(svc, "llm-1", "ns", default_image="own:1")) == "mine:2"


def test_trainings_services_and_commands_mount_no_service_account_token():
    """Their containers call no API: the namespace's default account is not theirs to use."""
    from hub_ext.backends.kubernetes_commands import command_pod
    from hub_ext.requests.rules import WorkloadRequest

    spec = TrainingSpec(name="t", project="p", command=["x"], gpu=1)
    svc = parse_spec({"name": "llm", "project": "p", "command": ["serve"], "gpu": 0.25})
    req = WorkloadRequest(project="p", kind="training", gpu_mode="whole", gpus=1, cpu=1,
                          memory_gib=1, command=["x"])
    pods = [worker_pod(spec, 0, KubernetesOptions(namespace="ns")), replica_pod(svc, "llm-1", "ns"),
            command_pod("c", "alice", req, "ns", "img:1")]
    assert [p["spec"].get("automountServiceAccountToken") for p in pods] == [False, False, False]
