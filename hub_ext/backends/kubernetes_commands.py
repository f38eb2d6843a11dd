"""Command workloads on Kubernetes: what ``POST /workloads`` submits of a kind other than a
workspace (a row of kind ``training`` or ``inference`` that no training job holds: one
command with one GPU ask), as the embedded mode runs it as one process.

Each is one pod placed by gpupool-scheduler (``command_pod``: the request's annotations,
the GPU ask as the workload contract writes it, CPU and memory, credentials by reference
to the Secret ``NAME-credentials`` and data sources as volumes). The pods are followed by a
watch (``Mirror``); while one waits its row carries the scheduler's reason and once bound it
is running (``cluster.events.PodEvents``, as for workspaces). Here:

- a ``pending`` row without a pod gets one (and its Secret);
- a pod that ended makes its row ``succeeded`` or ``failed`` (the container's exit code);
- a bound pod deleted by anyone but the hub (gpupool-scheduler evicts by deleting) puts the
  row back to ``pending``: it is created again, as the embedded scheduler requeues;
- a row in ``stopping`` (``DELETE /workloads/NAME``), ended or gone has its pod and Secret
  deleted; ``stopping`` ends ``stopped``.
"""

from __future__ import annotations

import contextlib
import logging

from sqlalchemy import select

from scheduler.contract import (
    PRELOAD,
    SCHEDULER_NAME,
    L,
    Preload,
    gpu_parts,
    request_annotations,
    workload_annotations,
)
from scheduler.kubernetes.client import ApiError, KubeClient
from scheduler.model import DEFAULT_POOL

from ..attachments import attach
from ..cluster.mirror import Mirror, WatchLoop
from ..db.events import add_event
from ..db.tables import WorkloadRow
from ..images import WORKLOAD_IMAGE, WORKLOAD_POD_SPEC
from ..requests.rules import FieldError, WorkloadRequest
from ..training.db import TrainingRow

log = logging.getLogger("gpupool")
LABEL = "gpupool.io/command"  # value: the workload's name (names are DNS labels)
KINDS = ("training", "inference")
_ACTIVE = ("pending", "running", "stopping", "releasing")


def command_pod(name: str, owner: str, req: WorkloadRequest, namespace: str, image: str,
                att: attach.Attachments | None = None, preload: Preload = PRELOAD) -> dict:
    demand = req.demand()
    ann = request_annotations(req.project, req.kind, preemptible=req.preemptible,
                              allow_over_quota=req.preemptible,
                              node_pool=req.node_pool if req.node_pool != DEFAULT_POOL else None,
                              gpu_model=req.gpu_model or None)
    gpu = gpu_parts(name, demand.gpus or demand.gpu_fraction, demand.gpu_memory_mib, preload)
    ann.update(gpu.annotations)
    ann.update(workload_annotations(name, owner))
    env = {"GPUPOOL_WORKLOAD": name, "GPUPOOL_PROJECT": req.project, **gpu.env}
    requests = {"cpu": f"{req.cpu:g}", "memory": f"{round(req.memory_gib * 1024)}Mi"}
    container: dict = {"name": "command", "image": image, "command": list(req.command),
                       "env": [{"name": k, "value": v} for k, v in sorted(env.items())],
                       "resources": {"requests": {**requests, **gpu.limits},
                                     "limits": {**requests, **gpu.limits}}}
    if gpu.shared:
        container["envFrom"] = gpu.env_from
    mounts, volumes = list(gpu.mounts), list(gpu.volumes)
    if att:
        parts = attach.pod_parts(att, attach.secret_name(name))
        container["env"] += parts.env
        mounts += parts.mounts
        volumes += parts.volumes
    spec: dict = {**WORKLOAD_POD_SPEC, "schedulerName": SCHEDULER_NAME, "restartPolicy": "Never",
                  "containers": [container]}
    if mounts:
        container["volumeMounts"], spec["volumes"] = mounts, volumes
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "annotations": ann,
                         "labels": {LABEL: name, L.MANAGED_BY: "gpupool"}},
            "spec": spec}


def _exit(pod: dict) -> tuple[str, str] | None:
    """(state, reason) of a pod that ended, else None."""
    phase = (pod.get("status") or {}).get("phase")
    if phase not in ("Succeeded", "Failed"):
        return None
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        term = (cs.get("state") or {}).get("terminated")
        if term:
            code = int(term.get("exitCode", 0))
            why = f" ({term['reason']})" if term.get("reason") else ""
            return ("succeeded" if code == 0 else "failed"), f"exited with code {code}{why}"
    return ("succeeded", "exited with code 0") if phase == "Succeeded" else ("failed", "the pod failed")


class KubernetesCommands(WatchLoop):
    """The hub's runner of command workloads on Kubernetes; one per hub process."""

    failure = "following command workloads failed"

    def __init__(self, kc: KubeClient, Session, namespace: str, images: dict[str, str] | None = None,
                 vault=None, poll_s: float = 1.0, preload: Preload = PRELOAD,
                 default_image: str = WORKLOAD_IMAGE):
        # images: environment -> image (Gpupool.environments), default_image for one without;
        # poll_s: how often the hub's rows are read (new submits, stops), the pods come by watch
        self.kc, self.Session, self.namespace, self.images = kc, Session, namespace, images or {}
        self.default_image = default_image
        self.vault, self.poll_s, self.preload = vault, poll_s, preload
        self.api = f"/api/v1/namespaces/{namespace}"
        self.pods = Mirror(kc, Session, {"pods": f"{self.api}/pods"}, selectors={"pods": LABEL})
        self._made: set[str] = set()  # created by this hub, not yet in the watch's copy
        self._seen: set[str] = set()  # in the watch's copy: gone from it means deleted

    async def poll(self) -> None:
        if not self.pods.ready:  # before the list, every command would look bare
            return
        pods = {p["metadata"]["labels"][LABEL]: p for p in self.pods.objects["pods"].values()}
        with self.Session() as s:
            jobs = set(s.scalars(select(TrainingRow.name)))
            rows = {w.name: (w.state, w.owner, w.project, w.kind, dict(w.spec or {})) for w in s.scalars(
                select(WorkloadRow).where(WorkloadRow.kind.in_(KINDS), WorkloadRow.state.in_(_ACTIVE)))
                if w.name not in jobs}
        self._seen |= set(pods)
        self._made -= set(pods)
        for name in set(pods) - set(rows):  # its row ended or was deleted
            await self._delete(name)
        for name, (state, owner, project, kind, spec) in rows.items():
            pod = pods.get(name)
            if state == "stopping":
                await self._delete(name)
                if pod is None:
                    self._end(name, "stopped", "stopped by a user")
            elif pod is None and name in self._seen:  # gone without the hub asking
                self._seen.discard(name)
                self._requeue(name)
            elif pod is None and state == "pending" and name not in self._made:
                await self._create(name, owner, project, kind, spec)
            elif pod is not None and (end := _exit(pod)) is not None:
                self._end(name, *end)
                await self._delete(name)

    async def _create(self, name: str, owner: str, project: str, kind: str, spec: dict) -> None:
        try:
            req = WorkloadRequest(**{**spec, "project": project, "kind": kind})
            att, values = attach.Attachments(project), {}
            if req.credentials or req.datasources:
                with self.Session() as s:
                    att = attach.check(s, project, req.credentials, req.datasources)
                    if att.credentials and self.vault is None:
                        raise FieldError("credentials", "this hub has no credentials vault")
                    values = attach.values(s, self.vault, att) if att.credentials else {}
                    attach.record_use(s, owner, name, att, "deliver")
                    s.commit()
            if values:
                await self.kc.apply(f"{self.api}/secrets", attach.secret_manifest(
                    attach.secret_name(name), self.namespace, values, {LABEL: name}))
            image = self.images.get(req.environment) or self.default_image
            await self.kc.post(f"{self.api}/pods", command_pod(name, owner, req, self.namespace, image, att,
                                                               self.preload))
        except ApiError as e:
            if e.status != 409:  # 409: made before a restart, the watch shows it soon
                self._end(name, "failed", f"could not start: {e}")
                return
        except (FieldError, TypeError, ValueError) as e:
            self._end(name, "failed", f"could not start: {e}")
            return
        self._made.add(name)

    async def _delete(self, name: str) -> None:
        self._made.discard(name)
        self._seen.discard(name)
        for path in (f"pods/{name}", f"secrets/{attach.secret_name(name)}"):
            with contextlib.suppress(ApiError):
                await self.kc.delete(f"{self.api}/{path}", {"apiVersion": "v1", "kind": "DeleteOptions",
                                                            "gracePeriodSeconds": 0})

    def _end(self, name: str, state: str, reason: str) -> None:
        with self.Session() as s:
            w = s.get(WorkloadRow, name)
            if w is None or w.state == state:
                return
            w.state, w.reason, w.placement = state, reason, []
            if state == "failed":  # as the embedded mode writes a process's end
                add_event(s, "exited", f"{name} {reason}", name, w.project)
            s.commit()

    def _requeue(self, name: str) -> None:
        with self.Session() as s:
            w = s.get(WorkloadRow, name)
            if w is not None and w.state in ("running", "releasing"):
                w.state, w.reason, w.placement = "pending", "evicted by gpupool-scheduler; queued again", []
                s.commit()


__all__ = ["KubernetesCommands", "command_pod"]
