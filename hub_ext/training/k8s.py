"""Kubernetes objects of a training job: one pod per worker (a gpupool gang) and a
headless Service so that workers find each other as ``NAME-RANK.NAME``.

Plain functions returning dicts (tested by comparing dicts). The pods carry the
annotations ``scheduler.k8s.objects.parse_pod`` reads (project, kind, priority,
preemptible, gang and gang size, fraction or memory, node pool, resumed) and the environment of
``torchrun``/``torch.distributed``: rank 0's stable DNS name is MASTER_ADDR, and each pod
is one node of the job (NODE_RANK = RANK, LOCAL_RANK 0).
"""

from __future__ import annotations

from dataclasses import dataclass

from scheduler.k8s.objects import A

from ..attach import Attachments, pod_parts, secret_manifest, secret_name
from .gang import distributed_env
from .spec import TrainingSpec

LABEL_JOB = "gpupool.io/training"
LABEL_RANK = "gpupool.io/rank"


@dataclass(frozen=True)
class K8sOptions:
    namespace: str = "default"
    scheduler_name: str = "gpupool"
    master_port: int = 29500
    checkpoint_claim: str = ""  # a PersistentVolumeClaim mounted at the checkpoint folder
    default_image: str = "python:3.11-slim"
    priority: int | None = None  # set on requeue (the spec's priority + 1)
    # Set on requeue too: the pods of a preempted job that restarts (as the embedded runner's
    # ``t.preemptions > 0 and t.status == "Preempted"``) carry gpupool.io/resumed, which
    # spares them from preemption for a while after they start (no preempt-resume thrash).
    resumed: bool = False
    # credentials (by reference to the Secret ``NAME-credentials``) and data sources
    attachments: Attachments = Attachments()


def _checkpoint_dir(spec: TrainingSpec) -> str:
    return spec.checkpoint_dir or "/checkpoints"


def headless_service(spec: TrainingSpec, opts: K8sOptions = K8sOptions()) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": spec.name, "namespace": opts.namespace,
                     "labels": {LABEL_JOB: spec.name, A.PROJECT: spec.project}},
        "spec": {
            "clusterIP": "None",
            "selector": {LABEL_JOB: spec.name},
            "publishNotReadyAddresses": True,
            "ports": [{"name": "dist", "port": opts.master_port, "targetPort": opts.master_port}],
        },
    }


def worker_pod(spec: TrainingSpec, rank: int, opts: K8sOptions = K8sOptions()) -> dict:
    name = f"{spec.name}-{rank}"
    master = f"{spec.name}-0.{spec.name}.{opts.namespace}.svc"
    env = {**spec.env, **distributed_env(rank, spec.workers, rank, 0, 1, master, opts.master_port,
                                         run_id=spec.name),
           "GPUPOOL_WORKLOAD": spec.name, "GPUPOOL_PROJECT": spec.project,
           "GPUPOOL_CHECKPOINT_DIR": _checkpoint_dir(spec)}
    annotations = {
        A.PROJECT: spec.project, A.KIND: "training",
        A.PRIORITY: str(opts.priority if opts.priority is not None else spec.priority),
        A.PREEMPTIBLE: str(spec.preemptible).lower(),
        A.GANG: spec.name, A.GANG_SIZE: str(spec.workers),
    }
    if opts.resumed:
        annotations[A.RESUMED] = "true"
    resources: dict = {"requests": {"cpu": f"{spec.cpu:g}", "memory": f"{round(spec.memory_gib * 1024)}Mi"}}
    container: dict = {
        "name": "worker",
        "image": spec.image or opts.default_image,
        "command": list(spec.command),
        "env": [{"name": k, "value": v} for k, v in sorted(env.items())],
        "ports": [{"name": "dist", "containerPort": opts.master_port}],
        "resources": resources,
    }
    if spec.gpu_memory_gib:
        annotations[A.MEMORY] = f"{round(spec.gpu_memory_gib * 1024)}Mi"
    elif 0 < spec.gpu < 1:
        annotations[A.FRACTION] = f"{spec.gpu:g}"
    elif spec.gpu >= 1:
        resources["limits"] = {"nvidia.com/gpu": str(int(spec.gpu))}
    if annotations.get(A.MEMORY) or annotations.get(A.FRACTION):
        # the scheduler writes this ConfigMap (GPU, memory cap, preload) before binding
        container["envFrom"] = [{"configMapRef": {"name": f"{name}-gpupool", "optional": False}}]
    if spec.node_pool:
        annotations[A.NODE_POOL] = spec.node_pool
    pod_spec: dict = {
        "schedulerName": opts.scheduler_name,
        "restartPolicy": "Never",  # the job controller restarts the whole gang, not a pod
        "terminationGracePeriodSeconds": int(spec.grace_period_s),
        "hostname": name,
        "subdomain": spec.name,
        "containers": [container],
    }
    if opts.checkpoint_claim:
        container["volumeMounts"] = [{"name": "checkpoints", "mountPath": _checkpoint_dir(spec)}]
        pod_spec["volumes"] = [{"name": "checkpoints",
                                "persistentVolumeClaim": {"claimName": opts.checkpoint_claim}}]
    if opts.attachments:
        parts = pod_parts(opts.attachments, secret_name(spec.name))
        container["env"] += parts.env
        container["volumeMounts"] = [*container.get("volumeMounts", []), *parts.mounts]
        pod_spec["volumes"] = [*pod_spec.get("volumes", []), *parts.volumes]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name, "namespace": opts.namespace,
            "labels": {LABEL_JOB: spec.name, LABEL_RANK: str(rank)},
            "annotations": annotations,
        },
        "spec": pod_spec,
    }


def training_objects(spec: TrainingSpec, opts: K8sOptions = K8sOptions(),
                     credential_values: dict[str, dict[str, str]] | None = None) -> list[dict]:
    """The credentials' Secret (when ``credential_values``: attach.values), the headless
    Service (so DNS exists when the workers start), then the pods."""
    secret = ([secret_manifest(secret_name(spec.name), opts.namespace, credential_values,
                               {LABEL_JOB: spec.name})] if credential_values else [])
    return [*secret, headless_service(spec, opts),
            *(worker_pod(spec, r, opts) for r in range(spec.workers))]
