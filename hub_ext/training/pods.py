"""Kubernetes objects of a training job: one pod per worker (a gpupool gang) and a
headless Service so that workers find each other as ``NAME-RANK.NAME``.

Plain functions returning dicts (tested by comparing dicts). The pods carry the
annotations ``scheduler.kubernetes.objects.parse_pod`` reads (project, kind, priority,
preemptible, gang and gang size, topology key, fraction or memory, node pool, resumed) and the environment of
``torchrun``/``torch.distributed``: rank 0's stable DNS name is MASTER_ADDR, and each pod
is one node of the job (NODE_RANK = RANK, LOCAL_RANK 0).
"""

from __future__ import annotations

from dataclasses import dataclass

from scheduler.contract import (
    PRELOAD,
    SCHEDULER_NAME,
    A,
    L,
    Preload,
    gpu_parts,
    memory_mib,
    request_annotations,
    workload_annotations,
)

from ..attachments.attach import Attachments, pod_parts, secret_manifest, secret_name
from ..images import WORKLOAD_IMAGE, WORKLOAD_POD_SPEC
from .gang import distributed_env
from .spec import TrainingSpec

LABEL_JOB = L.TRAINING
LABEL_RANK = L.RANK


@dataclass(frozen=True)
class KubernetesOptions:
    namespace: str = "default"
    scheduler_name: str = SCHEDULER_NAME
    master_port: int = 29500
    checkpoint_claim: str = ""  # a PersistentVolumeClaim mounted at the checkpoint folder
    default_image: str = WORKLOAD_IMAGE
    priority: int | None = None  # set on requeue (the spec's priority + 1)
    # Set on requeue too: the pods of a preempted job that restarts (as the embedded runner's
    # ``t.preemptions > 0 and t.status == "Preempted"``) carry gpupool.io/resumed, which
    # spares them from preemption for a while after they start (no preempt-resume thrash).
    resumed: bool = False
    # credentials (by reference to the Secret ``NAME-credentials``) and data sources
    attachments: Attachments = Attachments()
    preload: Preload = PRELOAD
    owner: str = ""  # the hub user who submitted it
    topology_key: str = ""  # node label the workers prefer to share (Gpupool.topology_key)


def _checkpoint_dir(spec: TrainingSpec) -> str:
    return spec.checkpoint_dir or "/checkpoints"


def headless_service(spec: TrainingSpec, opts: KubernetesOptions = KubernetesOptions()) -> dict:
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


def worker_pod(spec: TrainingSpec, rank: int, opts: KubernetesOptions = KubernetesOptions()) -> dict:
    name = f"{spec.name}-{rank}"
    master = f"{spec.name}-0.{spec.name}.{opts.namespace}.svc"
    env = {**spec.env, **distributed_env(rank, spec.workers, rank, 0, 1, master, opts.master_port,
                                         run_id=spec.name),
           "GPUPOOL_WORKLOAD": spec.name, "GPUPOOL_PROJECT": spec.project,
           "GPUPOOL_CHECKPOINT_DIR": _checkpoint_dir(spec)}
    annotations = request_annotations(
        spec.project, "training",
        priority=opts.priority if opts.priority is not None else spec.priority,
        preemptible=spec.preemptible, gang=spec.name, gang_size=spec.workers,
        node_pool=spec.node_pool or None, resumed=opts.resumed,
        topology_key=opts.topology_key or None)
    gpu = gpu_parts(name, spec.gpu, memory_mib(spec.gpu_memory_gib) if spec.gpu_memory_gib else 0,
                    opts.preload)
    annotations.update(gpu.annotations)
    annotations.update(workload_annotations(spec.name, opts.owner))
    env.update(gpu.env)
    resources: dict = {"requests": {"cpu": f"{spec.cpu:g}", "memory": f"{memory_mib(spec.memory_gib)}Mi"}}
    if gpu.limits:
        resources["limits"] = dict(gpu.limits)
    container: dict = {
        "name": "worker",
        "image": spec.image or opts.default_image,
        "command": list(spec.command),
        "env": [{"name": k, "value": v} for k, v in sorted(env.items())],
        "ports": [{"name": "dist", "containerPort": opts.master_port}],
        "resources": resources,
    }
    if gpu.shared:
        container["envFrom"] = gpu.env_from
    pod_spec: dict = {
        **WORKLOAD_POD_SPEC,
        "schedulerName": opts.scheduler_name,
        "restartPolicy": "Never",  # the job controller restarts the whole gang, not a pod
        "terminationGracePeriodSeconds": int(spec.grace_period_s),
        "hostname": name,
        "subdomain": spec.name,
        "containers": [container],
    }
    mounts, volumes = list(gpu.mounts), list(gpu.volumes)
    if opts.checkpoint_claim:
        mounts.append({"name": "checkpoints", "mountPath": _checkpoint_dir(spec)})
        volumes.append({"name": "checkpoints", "persistentVolumeClaim": {"claimName": opts.checkpoint_claim}})
    if mounts:
        container["volumeMounts"], pod_spec["volumes"] = mounts, volumes
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


def training_objects(spec: TrainingSpec, opts: KubernetesOptions = KubernetesOptions(),
                     credential_values: dict[str, dict[str, str]] | None = None) -> list[dict]:
    """The credentials' Secret (when ``credential_values``: attach.values), the headless
    Service (so DNS exists when the workers start), then the pods."""
    secret = ([secret_manifest(secret_name(spec.name), opts.namespace, credential_values,
                               {LABEL_JOB: spec.name})] if credential_values else [])
    return [*secret, headless_service(spec, opts),
            *(worker_pod(spec, r, opts) for r in range(spec.workers))]
