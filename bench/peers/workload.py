"""The one description of the work (queues and pods), and its translation per scheduler.

A queue is a team with a GPU quota and an over-quota weight; a pod asks for whole GPUs or a
fraction of one, and may belong to a gang. Each scheduler gets the same queues and pods in
its own terms, as its documentation says:

- gpupool-scheduler: a Department holding every Project (``gpupool.io/v1alpha1``), pods with
  ``schedulerName: gpupool`` and the ``gpupool.io/project`` / ``gpu-fraction`` / ``gang``
  annotations;
- KAI-Scheduler: a parent Queue with one leaf Queue per team (``scheduling.run.ai/v2``;
  ``limit: -1`` = no limit, an unset limit would block the resource), pods with
  ``schedulerName: kai-scheduler`` and the ``kai.scheduler/queue`` label, a fraction as the
  ``gpu-fraction`` annotation plus the ``runai/shared-gpu-configmap`` annotation that KAI's
  admission webhook would add, and a gang as a PodGroup with ``minMember`` that the pods name
  in ``pod-group-name``;
- kube-scheduler and the bare binding loop (the ceiling): plain pods (no queues, gangs or
  fractions).
"""

from __future__ import annotations

from dataclasses import dataclass

NS = "peers"
PARENT = "peers"
GPUPOOL = "gpupool"
KAI = "kai-scheduler"
KUBE = "default-scheduler"
CEILING = "bench-bare"  # bench/k8s_throughput.py's bare binding loop: no scheduling at all
GPUPOOL_API = "/apis/gpupool.io/v1alpha1"
KAI_API = "/apis/scheduling.run.ai/v2"
KAI_PG_API = "/apis/scheduling.run.ai/v2alpha2"


@dataclass(frozen=True)
class Queue:
    name: str
    quota: float  # guaranteed GPUs
    weight: float = 1.0  # share of idle GPUs beyond the quota, relative to the others


@dataclass(frozen=True)
class PodSpec:
    name: str
    queue: str
    gpus: int = 1  # whole GPUs (0 with a fraction)
    fraction: float | None = None
    gang: str | None = None
    gang_size: int = 0


def queue_objects(scheduler: str, queues: list[Queue], total_gpus: float) -> list[tuple[str, dict]]:
    """(collection path, object) for each queue object ``scheduler`` needs, parents first."""
    if scheduler == GPUPOOL:
        out = [(f"{GPUPOOL_API}/departments", {
            "apiVersion": "gpupool.io/v1alpha1", "kind": "Department",
            "metadata": {"name": PARENT},
            "spec": {"quotas": {"default": {"gpus": total_gpus}}}})]
        for q in queues:
            out.append((f"{GPUPOOL_API}/projects", {
                "apiVersion": "gpupool.io/v1alpha1", "kind": "Project",
                "metadata": {"name": q.name},
                "spec": {"department": PARENT, "quotas": {"default": {
                    "gpus": q.quota, "overQuotaWeight": q.weight}}}}))
        return out
    if scheduler == KAI:
        def res(gpu_quota: float, weight: float) -> dict:
            unlimited = {"quota": -1, "limit": -1, "overQuotaWeight": 1}
            return {"cpu": unlimited, "memory": unlimited,
                    "gpu": {"quota": gpu_quota, "limit": -1, "overQuotaWeight": weight}}

        out = [(f"{KAI_API}/queues", {
            "apiVersion": "scheduling.run.ai/v2", "kind": "Queue", "metadata": {"name": PARENT},
            "spec": {"resources": res(total_gpus, 1)}})]
        for q in queues:
            out.append((f"{KAI_API}/queues", {
                "apiVersion": "scheduling.run.ai/v2", "kind": "Queue", "metadata": {"name": q.name},
                "spec": {"parentQueue": PARENT, "resources": res(q.quota, q.weight)}}))
        return out
    return []


def gang_objects(scheduler: str, pods: list[PodSpec]) -> list[tuple[str, dict]]:
    """KAI's PodGroup for each gang (gpupool reads the gang from the pods' annotations)."""
    if scheduler != KAI:
        return []
    gangs = {(p.gang, p.queue, p.gang_size) for p in pods if p.gang}
    return [(f"{KAI_PG_API}/namespaces/{NS}/podgroups", {
        "apiVersion": "scheduling.run.ai/v2alpha2", "kind": "PodGroup",
        "metadata": {"name": gang, "namespace": NS, "labels": {"kai.scheduler/queue": queue}},
        "spec": {"minMember": size, "queue": queue}}) for gang, queue, size in sorted(gangs)]


def pod_object(scheduler: str, p: PodSpec) -> dict:
    labels = {"peers.gpupool.io/queue": p.queue}
    ann: dict[str, str] = {}
    limits = {"nvidia.com/gpu": str(p.gpus)} if p.gpus else {}
    if scheduler == GPUPOOL:
        ann.update({"gpupool.io/project": p.queue, "gpupool.io/kind": "training"})
        if p.fraction:
            ann["gpupool.io/gpu-fraction"] = str(p.fraction)
        if p.gang:
            ann.update({"gpupool.io/gang": p.gang, "gpupool.io/gang-size": str(p.gang_size)})
    elif scheduler == KAI:
        labels["kai.scheduler/queue"] = p.queue
        if p.fraction:
            ann["gpu-fraction"] = str(p.fraction)
            ann["runai/shared-gpu-configmap"] = f"{p.name}-shared-gpu"  # what admission adds
        if p.gang:
            ann["pod-group-name"] = p.gang
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": p.name, "namespace": NS, "labels": labels, "annotations": ann},
        "spec": {"schedulerName": scheduler, "terminationGracePeriodSeconds": 0,
                 "containers": [{"name": "main", "image": "busybox", "resources": {
                     "requests": {"cpu": "100m", "memory": "64Mi"}, "limits": limits}}]},
    }  # fmt: skip
