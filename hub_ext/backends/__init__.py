"""Where workloads run (``Gpupool.backend``): one ``Backend`` object per mode, built once at
the hub's start-up (``Runtime.backend``), with one implementation of each concern.

=================  ====================================  ===========================================
concern            embedded (``hub_ext.backends.embedded``)       kubernetes (``hub_ext.backends.kubernetes``)
=================  ====================================  ===========================================
placement          ``EmbeddedScheduler`` on the hub's    gpupool-scheduler (its own Deployment)
                   GPUs (NVML or ``declared_gpus``)      on the cluster's nodes; no declared GPUs
workspaces         ``GpupoolLocalSpawner``               ``GpupoolKubeSpawner``
trainings          ``training.embedded.JobRunner``       ``training.kubernetes.KubernetesTrainings``
commands           the embedded scheduler's processes    ``backends.kubernetes_commands.KubernetesCommands``
inference replicas the hub's activator, replicas as      published for the chart's activator, whose
                   processes (``serving.embedded``)      replicas are pods (``serving.kubernetes``)
logs               the owner's files                     the API server (pods/NAME/log)
GPU activity       the library's accounts (host)         the node agent's counters on the Nodes
exec (SSH)         ``ssh.embedded.EmbeddedBackend``      ``ssh.kubernetes.KubernetesBackend``
=================  ====================================  ===========================================

The gpupool service process asks only the mode's class (``mode``) for what needs nothing
built: logs, exec, activity. Every pod the Kubernetes implementations write follows
``scheduler.contract``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from scheduler.model import Node

from ..config import Gpupool
from ..host.activity import Activity

if TYPE_CHECKING:
    from ..backends.embedded import EmbeddedMode
    from ..backends.kubernetes import KubernetesMode

__all__ = ["Backend", "Trainings", "build", "mode"]


class Trainings(Protocol):
    """Runs the training jobs the REST API, CLI and widget submit (rows in state
    ``submitted``) and carries out their control requests (suspend, resume, delete)."""

    def start(self) -> None: ...
    async def stop(self) -> None: ...


class Backend(Protocol):
    """What the hub asks of the mode it runs in."""

    nodes: list[Node]  # placement: the GPUs the hub places on itself (none on Kubernetes)
    inventory_source: str  # "nvml", "declared" or "kubernetes"
    trainings: Trainings
    spawner_class: str  # workspaces: JupyterHub's spawner_class
    serves_inference: bool  # the hub runs the activator (else the chart's runs, published to)
    single_account: bool  # every workload runs as the hub's own account (personal mode)
    org_in_cluster: bool  # departments and projects are objects in the cluster (the truth)

    def start(self) -> None:
        """Start what follows the mode's workloads (on the hub's event loop)."""

    def free_per_gpu(self) -> list[int]:
        """Free milli-GPUs of each GPU the hub places on."""

    @staticmethod
    async def worker_log(cfg: Gpupool, name: str, rank: int, tail: int) -> list[str]:
        """The last ``tail`` lines of training ``name``'s worker ``rank``."""

    @staticmethod
    async def workload_log(cfg: Gpupool, name: str, kind: str, owner: str, tail: int,
                           offset: int | None, service: str = "") -> tuple[list[str], int]:
        """A workspace's, command's or inference replica's (``service``'s) output: its last
        ``tail`` lines, or with ``offset`` what came after that byte; and the offset it ends at."""

    @staticmethod
    async def ssh(cfg: Gpupool, Session) -> Any:
        """The SSH gateway's backend (``ssh.gateway.Backend``)."""

    @staticmethod
    def activity(cfg: Gpupool) -> Callable[[str], Activity | None]:
        """``workload region -> Activity``: what the interception library saw (the culler)."""


def mode(cfg: Gpupool) -> type[EmbeddedMode] | type[KubernetesMode]:
    """The class of ``cfg``'s mode: its static parts (logs, exec, activity) need nothing built.
    Only that mode's modules are imported."""
    if cfg.backend == "kubernetes":
        from ..backends.kubernetes import KubernetesMode

        return KubernetesMode
    from ..backends.embedded import EmbeddedMode

    return EmbeddedMode


def build(cfg: Gpupool, Session, store, delivery) -> EmbeddedMode | KubernetesMode:
    """The hub's backend for ``cfg.backend``; once per hub process (``Runtime``)."""
    return mode(cfg)(cfg, Session, store, delivery)
