"""The Kubernetes adapter's settings, and what its watcher and binder both name: the
custom resources' API group, the network errors they ride out, a pod's API path."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import aiohttp

from ..contract import DEFAULT_PRELOAD, SCHEDULER_NAME, A
from ..snapshot import SchedulerConfig

__all__ = ["GROUP", "NET_ERRORS", "RESERVATION_COMMAND", "AdapterConfig", "pod_path"]

GROUP = "/apis/gpupool.io/v1alpha1"
# A GPU reservation's container in the scheduler's image (reservations.main)
RESERVATION_COMMAND = ("python", "-m", "scheduler.kubernetes.reservations")
NET_ERRORS = (aiohttp.ClientError, OSError, asyncio.TimeoutError)


@dataclass
class AdapterConfig:
    scheduler_name: str = SCHEDULER_NAME
    node_pool_label: str = A.NODE_POOL
    preload_path: str = DEFAULT_PRELOAD
    bind_concurrency: int = 48
    status_concurrency: int = 4
    batch_s: float = 0.02  # gather events this long before a cycle
    resync_s: float = 30.0  # run a cycle at least this often while work waits
    pending_report_s: float = 10.0  # rewrite a pod's pending reason at most this often
    project_status_s: float = 5.0
    # How long a bind waits for its WaitForFirstConsumer claims to be provisioned and bound
    # (kube-scheduler's VolumeBinding bindTimeoutSeconds); then the pod is placed again.
    volume_bind_timeout_s: float = 600.0
    # Fractions on GPUs the kubelet reserved for them (reservations.py, decision 0060)
    gpu_reservations: bool = False
    reservation_namespace: str = "default"
    reservation_image: str = "gpupool-scheduler"
    reservation_service_account: str = "default"
    # the reservation container's command (empty: the image's entrypoint)
    reservation_command: tuple[str, ...] = RESERVATION_COMMAND
    reservation_timeout_s: float = 300.0
    core: SchedulerConfig | None = None


def pod_path(ns: str, name: str, sub: str = "") -> str:
    return f"/api/v1/namespaces/{ns}/pods/{name}" + (f"/{sub}" if sub else "")
