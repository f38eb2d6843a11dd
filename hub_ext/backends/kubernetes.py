"""The Kubernetes mode (``Gpupool.backend = "kubernetes"``, ``hub_ext.backends``): workloads
are pods that gpupool-scheduler binds. The hub has no GPUs of its own, no scheduler loop and
no processes; it writes trainings' pods through the API server, follows the organisation,
the inventory and the pods' events there, and publishes inference services for the chart's
activator."""

from __future__ import annotations

import asyncio
import logging

from scheduler.kubernetes.client import KubeClient

from ..cluster.events import PodEvents
from ..config import Gpupool
from ..training.kubernetes import KubernetesTrainings, worker_logs

log = logging.getLogger("gpupool")


def kube_client(cfg: Gpupool) -> KubeClient:
    """The hub's client of the API server (``cluster.org.kubeconfig_path``)."""
    from ..cluster.org import kubeconfig_path

    return KubeClient.from_file_or_pod(kubeconfig_path(cfg.kubeconfig))


class KubernetesMode:
    """The hub's backend on Kubernetes (``hub_ext.backends.Backend``)."""

    spawner_class = "hub_ext.workspaces.kubernetes.GpupoolKubeSpawner"
    serves_inference = False
    single_account = False
    org_in_cluster = True
    inventory_source = "kubernetes"  # the cluster's: hub_ext.cluster.inventory

    def __init__(self, cfg: Gpupool, Session, store=None, delivery=None):
        self.cfg, self.Session = cfg, Session
        self.nodes: list = []
        self.kube = kube_client(cfg)
        self.trainings = KubernetesTrainings(
            self.kube, Session, cfg.namespace, checkpoint_size=cfg.checkpoint_storage,
            storage_class=cfg.checkpoint_storage_class, default_image=cfg.workload_image)
        self.cluster: asyncio.Future | None = None
        log.info("gpupool: kubernetes backend: workloads are pods in namespace %s", cfg.namespace)

    def start(self) -> None:
        from ..cluster import (
            follow as cluster_follow,  # the organisation and the inventory from the cluster
        )

        self.trainings.start()
        self.cluster = asyncio.ensure_future(cluster_follow.follow(self.cfg, self.Session))
        asyncio.ensure_future(PodEvents(self.kube, self.Session, self.cfg.namespace).run())

    def free_per_gpu(self) -> list[int]:
        return []

    # -- logs, exec, activity: the service process's, nothing built ----------------------
    @staticmethod
    async def worker_log(cfg: Gpupool, name: str, rank: int, tail: int) -> list[str]:
        async with kube_client(cfg) as kc:  # the worker pod's log, through the API server
            return await worker_logs(kc, cfg.namespace, name, rank, tail)

    @staticmethod
    async def ssh(cfg: Gpupool, Session):
        from ..cluster.org import kubeconfig_path
        from ..ssh.kubernetes import KubernetesBackend

        return await KubernetesBackend.from_environment(cfg.namespace, kubeconfig_path(cfg.kubeconfig))

    @staticmethod
    def activity(cfg: Gpupool):
        """Nothing: the interception library's accounts are on the nodes, not beside the hub."""
        return _unseen


def _unseen(region: str) -> None:
    return None
