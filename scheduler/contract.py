"""The workload contract: what a gpupool workload carries and what it is given, in one place.

Every pod builder writes it (the workspace spawner, training gangs, inference replicas),
gpupool-scheduler reads it back (``scheduler.kubernetes.objects.parse_pod``), and the embedded
scheduler uses the same fractional environment for processes. Plain data and pure
functions, no I/O:

- ``A``: annotation names (requests are read from annotations first, then labels) and
  ``L``: label names of the objects the hub makes;
- ``request_annotations``: a workload's project, kind, priority, gang ...;
- ``gpu_parts``: a GPU ask as pod parts: whole GPUs as ``nvidia.com/gpu`` limits, a share
  as an annotation (one rounding: to a milli-GPU; one unit: MiB) plus the per-pod ConfigMap
  the scheduler writes (``envFrom``) and the interception library's volume and mount;
- ``share_env``: the fractional environment the interception library reads (memory cap in
  bytes, compute share in percent rounded up);
- ``waiting_reason``: why a pod still waits, as gpupool-scheduler wrote it on the pod
  (``PodScheduled=False``, ``scheduler.kubernetes.objects.scheduled_condition``);
- ``preemption_condition`` / ``preempted``: gpupool-scheduler marks a pod it evicts with
  ``DisruptionTarget=True`` (reason ``PreemptionByScheduler``, as kube-scheduler does) before
  it deletes it, so whoever watches the pod sees why it goes in its last state.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass, field

from .model import MILLI

__all__ = [
    "A",
    "GPU_RESOURCE",
    "L",
    "SCHEDULER_NAME",
    "GpuParts",
    "PRELOAD",
    "Preload",
    "config_map_name",
    "fraction_text",
    "gpu_parts",
    "memory_mib",
    "pod_condition",
    "preempted",
    "preemption_condition",
    "request_annotations",
    "share_env",
    "waiting_reason",
    "workload_annotations",
]

SCHEDULER_NAME = "gpupool"
GPU_RESOURCE = "nvidia.com/gpu"


class A:
    """Annotation (or label) names. Requests are read from annotations first, then labels."""

    PREFIX = "gpupool.io/"
    PROJECT = "gpupool.io/project"
    KIND = "gpupool.io/kind"
    PRIORITY = "gpupool.io/priority"
    PREEMPTIBLE = "gpupool.io/preemptible"
    OVER_QUOTA = "gpupool.io/allow-over-quota"
    FRACTION = "gpupool.io/gpu-fraction"
    MEMORY = "gpupool.io/gpu-memory"
    GANG = "gpupool.io/gang"
    GANG_SIZE = "gpupool.io/gang-size"
    NODE_POOL = "gpupool.io/node-pool"
    GPU_MODEL = "gpupool.io/gpu-model"
    TOPOLOGY = "gpupool.io/topology-key"
    CONFIG_MAP = "gpupool.io/config-map"
    # Set by a job controller on the pods of a job it restarted after a preemption: the core
    # then spares it from preemption for a while (SchedulerConfig.resume_protection_s).
    RESUMED = "gpupool.io/resumed"
    # Written by the hub: its workload and the user (read by the hub's event log only)
    WORKLOAD = "gpupool.io/workload"
    OWNER = "gpupool.io/owner"
    # Written by the scheduler when it binds (the restart state lives on the pods):
    GPU_INDICES = "gpupool.io/gpu-indices"
    GPU_MILLI = "gpupool.io/gpu-milli"
    OVER_QUOTA_PLACED = "gpupool.io/over-quota"
    PLANNED_NODE = "gpupool.io/node"
    # Node side (written by the node agent; optional):
    NODE_GPU_UUIDS = "gpupool.io/gpu-uuids"
    NODE_GPU_ACTIVITY = "gpupool.io/gpu-activity"  # JSON: pod uid -> [launches, allocs, last s]
    NODE_GPU_PRODUCT = "nvidia.com/gpu.product"
    NODE_GPU_MEMORY = "nvidia.com/gpu.memory"

    ALL_REQUEST = (PROJECT, KIND, PRIORITY, PREEMPTIBLE, OVER_QUOTA, FRACTION, MEMORY, GANG,
                   GANG_SIZE, NODE_POOL, GPU_MODEL, TOPOLOGY, CONFIG_MAP, RESUMED)


class L:
    """Labels of the objects the hub makes (selectors find them by these)."""

    MANAGED_BY = "app.kubernetes.io/managed-by"
    TRAINING = "gpupool.io/training"  # a training's pods, Service and checkpoint claim
    RANK = "gpupool.io/rank"
    INFERENCE = "gpupool.io/inference-service"


def workload_annotations(workload: str, owner: str = "") -> dict[str, str]:
    """Which hub workload a pod belongs to and whose it is (the event log and GPU-hours are
    kept per workload and user); annotations, as hub names are not label values."""
    out = {A.WORKLOAD: workload}
    if owner:
        out[A.OWNER] = owner
    return out


@dataclass(frozen=True)
class Preload:
    """The interception library: copied by gpupool-node-agent to ``host_dir`` on each node,
    mounted read-only at ``mount_dir`` in every pod with a share of a GPU."""

    host_dir: str = "/var/lib/gpupool/lib"
    mount_dir: str = "/usr/local/lib/gpupool"
    name: str = "libgpupool.so"
    VOLUME = "gpupool-preload"

    @property
    def path(self) -> str:
        """LD_PRELOAD in the pod (gpupool-scheduler's ``--preload-path``)."""
        return f"{self.mount_dir.rstrip('/')}/{self.name}"

    def volume(self) -> dict:
        return {"name": self.VOLUME, "hostPath": {"path": self.host_dir, "type": "DirectoryOrCreate"}}

    def mount(self) -> dict:
        return {"name": self.VOLUME, "mountPath": self.mount_dir, "readOnly": True}


PRELOAD = Preload()  # the chart's and the node agent's defaults
DEFAULT_PRELOAD = PRELOAD.path

# The interception library's account of a pod with a share (GPUPOOL_SHARED_REGION): a file in
# an emptyDir, writable by whatever user the container runs as, which gpupool-node-agent
# reads in the kubelet's folder of the pod (``region_host_path``) to publish the pod's
# activity counters on its Node (``A.NODE_GPU_ACTIVITY``); the hub's culler reads them there.
REGION_VOLUME = "gpupool-region"
REGION_MOUNT = "/var/run/gpupool/region"
REGION_FILE = "account"
KUBELET_PODS_DIR = "/var/lib/kubelet/pods"
# The counters at the head of an account (native/src/account.c, struct gp_region): magic,
# layout, launches, allocations, wall clock of the last of either in ms.
REGION_MAGIC = 0x67707032  # "gpp2", GP_REGION_MAGIC
REGION_HEAD = struct.Struct("<IIQQQ")


def region_host_path(pods_dir: str, pod_uid: str) -> str:
    """Where the account of pod ``pod_uid`` lies on its node (``pods_dir``: the kubelet's)."""
    return f"{pods_dir.rstrip('/')}/{pod_uid}/volumes/kubernetes.io~empty-dir/{REGION_VOLUME}/{REGION_FILE}"


def region_counters(head: bytes) -> tuple[int, int, float] | None:
    """(launches, allocations, last active in s) from an account's first bytes; (0, 0, 0)
    for an empty one (never touched the GPU), None for one this library version did not write."""
    if not head.strip(b"\0"):
        return 0, 0, 0.0
    if len(head) < REGION_HEAD.size:
        return None
    magic, _layout, launches, allocs, last_ms = REGION_HEAD.unpack(head[:REGION_HEAD.size])
    return (launches, allocs, last_ms / 1000.0) if magic == REGION_MAGIC else None


def config_map_name(pod_name: str) -> str:
    """The per-pod ConfigMap of a fractional pod (written by the scheduler before it binds)."""
    return f"{pod_name}-gpupool"


def fraction_text(fraction: float) -> str:
    """A share of a GPU as written in ``A.FRACTION``: rounded to a milli-GPU, the scheduler's
    unit, so the pod asks for exactly what it is given."""
    return f"{round(fraction * MILLI) / MILLI:g}"


def memory_mib(gib: float) -> int:
    """GPU memory in GiB (forms, specs) -> whole MiB, rounded up: never less than asked."""
    return math.ceil(gib * 1024 - 1e-9)


def request_annotations(project: str, kind: str, *, priority: int | None = None,
                        preemptible: bool | None = None, allow_over_quota: bool | None = None,
                        gang: str | None = None, gang_size: int | None = None,
                        node_pool: str | None = None, gpu_model: str | None = None,
                        resumed: bool = False, topology_key: str | None = None) -> dict[str, str]:
    ann = {A.PROJECT: project, A.KIND: kind}
    if priority is not None:
        ann[A.PRIORITY] = str(int(priority))
    if preemptible is not None:
        ann[A.PREEMPTIBLE] = "true" if preemptible else "false"
    if allow_over_quota is not None:
        ann[A.OVER_QUOTA] = "true" if allow_over_quota else "false"
    if gang:
        ann[A.GANG], ann[A.GANG_SIZE] = gang, str(int(gang_size or 1))
        if topology_key:  # the node label a gang's pods prefer to share (e.g. a rack)
            ann[A.TOPOLOGY] = topology_key
    if node_pool:
        ann[A.NODE_POOL] = node_pool
    if gpu_model:
        ann[A.GPU_MODEL] = gpu_model
    if resumed:
        ann[A.RESUMED] = "true"
    return ann


@dataclass
class GpuParts:
    """A GPU ask as the parts of a pod (merged into the builder's own)."""

    annotations: dict[str, str] = field(default_factory=dict)
    limits: dict[str, str] = field(default_factory=dict)  # also the requests
    env: dict[str, str] = field(default_factory=dict)
    env_from: list[dict] = field(default_factory=list)
    volumes: list[dict] = field(default_factory=list)
    mounts: list[dict] = field(default_factory=list)

    @property
    def shared(self) -> bool:
        return bool(self.env_from)


def gpu_parts(pod_name: str, gpus: float = 0, gpu_memory_mib: int = 0,
              preload: Preload = PRELOAD) -> GpuParts:
    """``gpus``: whole GPUs (>= 1) or a share (0 < gpus < 1); ``gpu_memory_mib`` instead of a
    share: GPU memory. A share gets the scheduler's ConfigMap and the library mounted."""
    parts = GpuParts()
    if gpu_memory_mib:
        parts.annotations[A.MEMORY] = f"{int(gpu_memory_mib)}Mi"
    elif 0 < gpus < 1:
        parts.annotations[A.FRACTION] = fraction_text(gpus)
    elif gpus >= 1:
        parts.limits[GPU_RESOURCE] = str(int(gpus))
        return parts
    else:
        return parts
    cm = config_map_name(pod_name)
    parts.annotations[A.CONFIG_MAP] = cm
    parts.env_from = [{"configMapRef": {"name": cm, "optional": False}}]
    parts.volumes = [preload.volume(), {"name": REGION_VOLUME, "emptyDir": {}}]
    parts.mounts = [preload.mount(), {"name": REGION_VOLUME, "mountPath": REGION_MOUNT}]
    parts.env = {"LD_PRELOAD": preload.path, "GPUPOOL_SHARED_REGION": f"{REGION_MOUNT}/{REGION_FILE}"}
    return parts


def share_env(gpu_memory_mib: int, gpu_milli: int, demand_memory_mib: int = 0) -> dict[str, str]:
    """The interception library's limits for a share of one GPU (native/README.md): the
    memory cap in bytes (what was asked, else the share of the GPU's memory, rounded down)
    and the share of SM time in percent (rounded up: a share never gets 0)."""
    cap = demand_memory_mib * 2**20 if demand_memory_mib else gpu_memory_mib * 2**20 * gpu_milli // MILLI
    return {
        "GPUPOOL_MEMORY_LIMIT": str(cap),
        "GPUPOOL_COMPUTE_SHARE": str(max(1, min(100, math.ceil(gpu_milli / 10)))),
    }


def pod_condition(pod: dict, kind: str) -> dict | None:
    """The pod's status condition of type ``kind`` (API JSON), or None."""
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == kind:
            return c
    return None


def waiting_reason(pod: dict | None) -> str | None:
    """gpupool-scheduler's reason while ``pod`` waits for a placement; None once bound."""
    if not pod or (pod.get("spec") or {}).get("nodeName"):
        return None
    sched = pod_condition(pod, "PodScheduled")
    if sched and sched.get("status") == "False":
        return sched.get("message") or sched.get("reason")
    return None


DISRUPTION_TARGET = "DisruptionTarget"
PREEMPTION_REASON = "PreemptionByScheduler"


def preemption_condition(message: str, now: str) -> dict:
    """A strategic-merge patch of the pod status written before an eviction's delete."""
    return {"status": {"conditions": [{
        "type": DISRUPTION_TARGET, "status": "True", "reason": PREEMPTION_REASON,
        "message": message[:1024], "lastTransitionTime": now,
    }]}}  # fmt: skip


def preempted(pod: dict | None) -> bool:
    """Whether gpupool-scheduler evicted ``pod`` (its mark, ``preemption_condition``)."""
    c = pod_condition(pod or {}, DISRUPTION_TARGET)
    return bool(c and c.get("status") == "True" and c.get("reason") == PREEMPTION_REASON)
