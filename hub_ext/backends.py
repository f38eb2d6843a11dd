"""Where workloads run (``Gpupool.backend``): one interface per concern, an embedded and a
Kubernetes implementation of each. The hub builds only those of the chosen backend.

=================  ====================================  ===========================================
concern            embedded                              kubernetes
=================  ====================================  ===========================================
placement          ``EmbeddedScheduler`` on the hub's    gpupool-scheduler (its own Deployment)
                   GPUs (NVML or ``declared_gpus``)      on the cluster's nodes; no declared GPUs
workspaces         ``GpupoolLocalSpawner``               ``GpupoolKubeSpawner``
trainings          ``training.runner.JobRunner``         ``training.controller.K8sTrainings``
inference replicas ``inference.backends.embedded``       ``inference.backends.k8s.K8sBackend``
logs               the owner's files                     the API server (pods/NAME/log)
=================  ====================================  ===========================================

Every pod the Kubernetes implementations write follows ``scheduler.contract``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from scheduler.k8s.client import KubeClient

from .config import Gpupool

__all__ = ["Trainings", "kube_client", "replica_backend"]


class Trainings(Protocol):
    """Runs the training jobs the REST API, CLI and widget submit (rows in state
    ``submitted``) and carries out their control requests (suspend, resume, delete)."""

    def start(self) -> None: ...
    async def stop(self) -> None: ...


def kube_client(cfg: Gpupool) -> KubeClient:
    """The hub's client of the API server (``k8s_org.kubeconfig_path``)."""
    from .cluster.org import kubeconfig_path

    return KubeClient.from_file_or_pod(kubeconfig_path(cfg.kubeconfig))


def replica_backend(rt):
    """The inference controller's backend (``inference.controller.Backend``) for ``rt``."""
    if rt.cfg.backend == "kubernetes":
        from .serving.backends.k8s import K8sBackend

        return K8sBackend(rt.kube, rt.cfg.namespace)
    from .serving.backends.embedded import EmbeddedBackend

    return EmbeddedBackend(rt.scheduler, launcher=rt.launcher, accounts=rt.accounts,
                           state_dir=Path(rt.cfg.state_dir) / "inference", rows=rt.store,
                           preload=rt.cfg.preload_library, delivery=rt.delivery)

