"""The Kubernetes mode (``Gpupool.backend = "kubernetes"``, ``hub_ext.backends``): workloads
are pods that gpupool-scheduler binds. The hub has no GPUs of its own, no scheduler loop and
no processes; it writes trainings' pods through the API server, follows the organisation,
the inventory and the pods' events there, and publishes inference services for the chart's
activator."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging

from scheduler.contract import A, L
from scheduler.kubernetes.client import ApiError, KubeClient

from ..cluster.events import PodEvents
from ..config import Gpupool
from ..host.activity import NONE, Activity
from ..training.kubernetes import KubernetesTrainings, worker_logs
from .kubernetes_commands import KubernetesCommands

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
            storage_class=cfg.checkpoint_storage_class, topology_key=cfg.topology_key,
            vault=delivery.vault if delivery is not None else None, default_image=cfg.workload_image)
        self.commands = KubernetesCommands(
            self.kube, Session, cfg.namespace, vault=self.trainings.vault,
            images={k: (v or {}).get("image") or "" for k, v in cfg.environments.items()})
        self.cluster: asyncio.Future | None = None
        log.info("gpupool: kubernetes backend: workloads are pods in namespace %s", cfg.namespace)

    def start(self) -> None:
        from ..cluster import (
            follow as cluster_follow,  # the organisation and the inventory from the cluster
        )

        self.trainings.start()
        self.commands.start()
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
    async def workload_log(cfg: Gpupool, name: str, kind: str, owner: str, tail: int,
                           offset: int | None, service: str = "") -> tuple[list[str], int]:
        """The log of the workload's pod from the API server (``pods/NAME/log``); the offset
        counts bytes of that log, so a follow (``offset``) gets what was written since."""
        api = f"/api/v1/namespaces/{cfg.namespace}/pods"
        async with kube_client(cfg) as kc:
            pod = await workload_pod(kc, api, name, service)
            if pod is None:
                return [], 0
            container = pod["spec"]["containers"][0]["name"]
            try:
                raw = await kc.request("GET", f"{api}/{pod['metadata']['name']}/log",
                                       params={"container": container}, decode=False, as_bytes=True)
            except ApiError:  # not started yet: no log
                return [], 0
        start = offset if offset is not None and offset <= len(raw) else 0  # a new pod: its start
        lines = raw[start:].decode(errors="replace").splitlines()
        return (lines if offset is not None else lines[-tail:]), len(raw)

    @staticmethod
    async def ssh(cfg: Gpupool, Session):
        from ..cluster.org import kubeconfig_path
        from ..ssh.kubernetes import KubernetesBackend

        return await KubernetesBackend.from_environment(cfg.namespace, kubeconfig_path(cfg.kubeconfig))

    @staticmethod
    def activity(cfg: Gpupool) -> ClusterActivity:
        """The interception library's counters as gpupool-node-agent publishes them on the
        Nodes (the accounts are on the nodes, not beside the hub)."""
        return ClusterActivity(cfg)


async def workload_pod(kc: KubeClient, api: str, name: str, service: str = "") -> dict | None:
    """The pod of hub workload ``name`` (its ``gpupool.io/workload`` annotation; the newest
    when a restart left two), or inference ``service``'s replica pod ``name``."""
    if service:
        try:
            pod = await kc.get(f"{api}/{name}")
        except ApiError:
            return None
        return pod if (pod["metadata"].get("labels") or {}).get(L.INFERENCE) == service else None
    pods, _ = await kc.list_all(api)
    mine = [p for p in pods if (p["metadata"].get("annotations") or {}).get(A.WORKLOAD) == name]
    return max(mine, key=lambda p: p["metadata"].get("creationTimestamp") or "", default=None)


class ClusterActivity:
    """``region -> Activity`` for the culler: a workspace's or command's region is its hub
    workload's name (the pod's ``gpupool.io/workload``), a training worker's is its pod's name
    (``training.db.worker_region``). ``refresh`` reads the Nodes' ``gpupool.io/gpu-activity``
    and the namespace's pods again (once per culler pass). A share on a node whose agent
    publishes, without an account yet, never touched the GPU (``NONE``); a pod on a node
    without an agent's counters is unseen (None: the culler falls back as without them)."""

    def __init__(self, cfg: Gpupool):
        self.cfg = cfg
        self._by_region: dict[str, Activity] = {}

    async def refresh(self) -> None:
        async with kube_client(self.cfg) as kc:
            nodes, _ = await kc.list_all("/api/v1/nodes")
            pods, _ = await kc.list_all(f"/api/v1/namespaces/{self.cfg.namespace}/pods")
        self._by_region = activity_by_region(nodes, pods)

    def __call__(self, region: str) -> Activity | None:
        return self._by_region.get(region)


def activity_by_region(nodes: list[dict], pods: list[dict]) -> dict[str, Activity]:
    counters: dict[str, dict[str, list]] = {}  # node -> pod uid -> counters
    for n in nodes:
        raw = (n["metadata"].get("annotations") or {}).get(A.NODE_GPU_ACTIVITY)
        if raw:
            with contextlib.suppress(ValueError):
                counters[n["metadata"]["name"]] = json.loads(raw)
    out: dict[str, Activity] = {}
    for p in pods:
        meta, node = p["metadata"], (p.get("spec") or {}).get("nodeName")
        ann, labels = meta.get("annotations") or {}, meta.get("labels") or {}
        if node not in counters or not (ann.get(A.FRACTION) or ann.get(A.MEMORY)):
            continue
        region = meta["name"] if labels.get(L.TRAINING) else ann.get(A.WORKLOAD)
        seen = counters[node].get(meta.get("uid", ""))
        if region:
            out[region] = Activity(*seen) if seen else NONE
    return out
