"""Trainings on Kubernetes: the hub's controller of training gangs as pods.

It takes the jobs the REST API, the CLI and the widget submit (rows in state ``submitted``,
as the embedded ``JobRunner`` does) and makes, per job, a checkpoint claim that outlives
the pods (``NAME-checkpoints``), a headless Service and one pod per worker
(``training.pods.training_objects``) that gpupool-scheduler binds as one gang. It follows
the pods with a watch (``cluster.mirror.Mirror``: listed once, then each change wakes it) and
moves the job:

- Pending, with gpupool-scheduler's reason (the pods' ``PodScheduled=False`` message);
- Running once every worker is bound and running;
- Preempted when a bound worker is deleted by anyone but the hub (gpupool-scheduler
  evicts by deleting): the rest of the gang is deleted, then the job is created again
  with its priority raised by its preemption count, ``gpupool.io/resumed`` and the same
  checkpoint claim;
- Succeeded when every worker succeeded, Failed when one failed (its exit code).

Credentials and data sources are checked and their values read from the vault at each
launch: the values go into the Secret ``NAME-credentials`` (replaced, so a rotated value
reaches a requeued gang), the pods reference it and mount the data sources
(``attach.pod_parts``). Suspend and delete delete the pods (delete also the Service, the
claim and the Secret). Logs come from the API server (``logs``).
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass

from scheduler.contract import A, L, waiting_reason
from scheduler.kubernetes.client import ApiError, KubeClient

from ..attachments import attach
from ..cluster.mirror import Mirror, WatchLoop
from ..db.events import add_event
from ..db.tables import WorkloadRow
from ..images import WORKLOAD_IMAGE
from ..requests.rules import FieldError
from .db import FINAL, SUBMITTED, TrainingRow, set_status, take_requests
from .pods import KubernetesOptions, training_objects
from .spec import TrainingSpec

log = logging.getLogger("gpupool.training")

__all__ = ["GangState", "KubernetesTrainings", "checkpoint_claim", "gang_state", "worker_logs"]


@dataclass(frozen=True)
class GangState:
    status: str  # Pending | Running | Preempted | Succeeded | Failed
    reason: str = ""
    placement: tuple[dict, ...] = ()  # per bound worker: {node, gpu_indices, gpu_milli}


def _placement(pod: dict) -> dict:
    """Where gpupool-scheduler bound a worker (its annotations, written with the binding)."""
    ann = pod["metadata"].get("annotations") or {}
    idx = [int(i) for i in (ann.get(A.GPU_INDICES) or "").split(",") if i.strip().isdigit()]
    milli = int(ann.get(A.GPU_MILLI) or 0) if idx else 0
    return {"node": pod["spec"]["nodeName"], "gpu_indices": idx, "gpu_milli": milli}


def _exit(pod: dict) -> tuple[int, str] | None:
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        term = (cs.get("state") or {}).get("terminated")
        if term:
            return int(term.get("exitCode", 0)), term.get("reason") or ""
    return None


def gang_state(pods: list[dict], workers: int) -> GangState:
    """The job's state from its worker pods (API JSON). A bound worker that is being
    deleted or gone, while the job did not ask for it, is a preemption; so is one that
    exited while being deleted (a worker that saves on SIGTERM exits with 143 then)."""
    bound = [p for p in pods if (p.get("spec") or {}).get("nodeName")]
    for p in pods:
        if p["metadata"].get("deletionTimestamp"):
            continue
        phase = (p.get("status") or {}).get("phase")
        code = _exit(p)
        if phase == "Failed" or (code is not None and code[0] != 0):
            c, why = code or (1, (p.get("status") or {}).get("reason") or "")
            return GangState("Failed", f"worker {p['metadata']['name']} exited with code {c}"
                             + (f" ({why})" if why else ""))
    if len(pods) == workers and all((p.get("status") or {}).get("phase") == "Succeeded" for p in pods):
        return GangState("Succeeded", "every worker exited with code 0")
    leaving = [p for p in pods if p["metadata"].get("deletionTimestamp")]
    if bound and (leaving or len(pods) < workers):
        return GangState("Preempted", "its workers were evicted by gpupool-scheduler")
    nodes = ", ".join(sorted({p["spec"]["nodeName"] for p in bound}))
    placement = tuple(_placement(p) for p in sorted(bound, key=lambda p: p["metadata"]["name"]))
    if len(bound) == workers == len(pods):
        if all((p.get("status") or {}).get("phase") == "Running" for p in pods):
            return GangState("Running", f"{workers} worker(s) running on {nodes}", placement)
        return GangState("Pending", f"bound to {nodes}; containers starting", placement)
    for p in pods:
        why = waiting_reason(p)
        if why:
            return GangState("Pending", why)
    return GangState("Pending", "waiting for gpupool-scheduler")


async def worker_logs(kc: KubeClient, namespace: str, name: str, rank: int, tail: int = 200) -> list[str]:
    """Worker ``rank``'s output, from the API server; none before its pod exists."""
    try:
        raw = await kc.request("GET", f"/api/v1/namespaces/{namespace}/pods/{name}-{rank}/log",
                               params={"tailLines": tail}, decode=False, as_bytes=True)
    except ApiError:
        return []
    return raw.decode(errors="replace").splitlines()[-tail:]


def checkpoint_claim(name: str) -> str:
    return f"{name}-checkpoints"


def claim_manifest(spec: TrainingSpec, namespace: str, size: str, storage_class: str = "") -> dict:
    claim: dict = {
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": checkpoint_claim(spec.name), "namespace": namespace,
                     "labels": {L.TRAINING: spec.name, L.MANAGED_BY: "gpupool"}},
        "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": size}}},
    }
    if storage_class:
        claim["spec"]["storageClassName"] = storage_class
    return claim


class KubernetesTrainings(WatchLoop):
    """The training backend on Kubernetes; one per hub process (``KubernetesMode.trainings``)."""

    failure = "training controller poll failed"

    def __init__(self, kc: KubeClient, Session, namespace: str, poll_s: float = 0.5,
                 checkpoint_size: str = "10Gi", storage_class: str = "", vault=None,
                 topology_key: str = "", default_image: str = WORKLOAD_IMAGE):
        # poll_s: how often the hub's own rows are read (new jobs, control requests); the
        # pods come from the watch, and any change of one wakes the controller at once
        self.kc, self.Session, self.namespace, self.poll_s = kc, Session, namespace, poll_s
        self.checkpoint_size, self.storage_class = checkpoint_size, storage_class
        self.vault = vault  # credentials.Vault: opens the attached credentials' values
        self.topology_key = topology_key
        self.default_image = default_image
        self.api = f"/api/v1/namespaces/{namespace}"
        self.pods = Mirror(kc, Session, {"pods": f"{self.api}/pods"}, selectors={"pods": L.TRAINING})
        self._busy: set[str] = set()  # jobs whose pods the hub itself is deleting or creating

    def _pods_of(self, name: str) -> list[dict]:
        return [p for p in self.pods.objects["pods"].values()
                if (p["metadata"].get("labels") or {}).get(L.TRAINING) == name]

    async def poll(self) -> None:
        """Launch new jobs, carry out control requests, follow every active job's pods
        (once the watch has listed them: before, every job would look bare)."""
        with self.Session() as s:
            new = [w.name for w in s.query(WorkloadRow).filter(
                WorkloadRow.kind == "training", WorkloadRow.state == SUBMITTED)]
            todo = take_requests(s)
            active = [(t.name, TrainingSpec.from_dict(t.spec), t.status) for t in
                      s.query(TrainingRow).filter(TrainingRow.status.notin_((*FINAL, "Suspended")))]
            s.commit()
        for name in new:
            await self.launch(name)
        for name, what, reason in todo:
            await self.control(name, what, reason)
        if not self.pods.ready:
            return
        by_job: dict[str, list[dict]] = {}
        for p in self.pods.objects["pods"].values():
            by_job.setdefault(p["metadata"]["labels"][L.TRAINING], []).append(p)
        # a job just suspended or deleted is not followed with the status read before that
        done = {name for name, _, _ in todo}
        for name, spec, status in active:
            if name not in self._busy and name not in new and name not in done:
                await self._follow(name, spec, status, by_job.get(name, []))

    # -- one job -------------------------------------------------------------------------
    async def _post(self, obj: dict) -> None:
        plural = {"Pod": "pods", "Service": "services", "Secret": "secrets",
                  "PersistentVolumeClaim": "persistentvolumeclaims"}[obj["kind"]]
        if obj["kind"] == "Pod":
            await self.kc.post(f"{self.api}/{plural}", obj)
        elif obj["kind"] == "Secret":  # the values as they are now
            await self.kc.apply(f"{self.api}/{plural}", obj)
        else:  # the Service and claim outlive pods
            await self.kc.ensure(f"{self.api}/{plural}", obj)

    async def launch(self, name: str, resumed: bool = False) -> None:
        """Create the job's claim, Service and worker pods; its priority is raised by one per
        preemption so that a requeued gang goes ahead of the work that preempted it."""
        with self.Session() as s:
            t = s.get(TrainingRow, name)
            if t is None:
                return
            spec, preemptions, owner = TrainingSpec.from_dict(t.spec), t.preemptions, t.owner
        try:
            att, values = self._attachments(name, owner, spec)
        except FieldError as e:  # a credential or data source deleted since the submit
            self._set(name, "Failed", f"could not attach: {e}", "failed", workload_state="failed")
            return
        opts = KubernetesOptions(namespace=self.namespace, checkpoint_claim=checkpoint_claim(name), owner=owner,
                                 default_image=self.default_image,
                                 priority=spec.priority + preemptions if preemptions else None, resumed=resumed,
                                 attachments=att, topology_key=self.topology_key)
        self._busy.add(name)
        try:
            await self._post(claim_manifest(spec, self.namespace, self.checkpoint_size, self.storage_class))
            for obj in training_objects(spec, opts, values):
                await self._post(obj)
        except ApiError as e:
            self._set(name, "Failed", f"could not create its pods: {e}", "failed", workload_state="failed")
            return
        finally:
            self._busy.discard(name)
        self._set(name, "Pending", "requeued with its checkpoint claim" if resumed else
                  "waiting for gpupool-scheduler", workload_state="pending")

    def _attachments(self, name: str, owner: str, spec: TrainingSpec
                     ) -> tuple[attach.Attachments, dict[str, dict[str, str]]]:
        """The job's credentials and data sources, checked again, and the credentials' values;
        each delivery is audited."""
        if not spec.credentials and not spec.datasources:
            return attach.Attachments(spec.project), {}
        with self.Session() as s:
            att = attach.check(s, spec.project, spec.credentials, spec.datasources)
            if att.credentials and self.vault is None:
                raise FieldError("credentials", "this hub has no credentials vault")
            values = attach.values(s, self.vault, att) if att.credentials else {}
            attach.record_use(s, owner, name, att, "deliver")
            s.commit()
        return att, values

    async def _follow(self, name: str, spec: TrainingSpec, status: str, pods: list[dict]) -> None:
        g = gang_state(pods, spec.workers)
        if g.status == "Pending" and not pods and status in ("Running", "Pending"):
            with self.Session() as s:
                w = s.get(WorkloadRow, name)
                launched = w is not None and w.state in ("pending", "running")
            if launched and status == "Running":  # every worker vanished at once
                g = GangState("Preempted", "its workers were evicted by gpupool-scheduler")
        if g.status == "Preempted":
            await self._preempted(name, spec)
            return
        if g.status == status and g.status != "Pending":
            return
        state = {"Running": "running", "Succeeded": "succeeded", "Failed": "failed"}.get(g.status, "pending")
        event = {"Running": "started", "Succeeded": "succeeded", "Failed": "failed"}.get(g.status)
        with self.Session() as s:
            t = s.get(TrainingRow, name)
            if t is None or (t.status == g.status and t.reason == g.reason):
                return
        self._set(name, g.status, g.reason, event if g.status != status else None, workload_state=state,
                  placement=list(g.placement))

    async def _preempted(self, name: str, spec: TrainingSpec) -> None:
        """The whole gang restarts: delete what is left, wait until it is gone, create it again."""
        with self.Session() as s:
            t = s.get(TrainingRow, name)
            n = (t.preemptions if t else 0) + 1
        self._set(name, "Preempted", "its workers were evicted by gpupool-scheduler; requeued",
                  "preempted", workload_state="pending", preemptions=n)
        self._busy.add(name)
        try:
            await self._delete_pods(name, grace=int(spec.grace_period_s))
        finally:
            self._busy.discard(name)
        await self.launch(name, resumed=True)

    async def _delete_pods(self, name: str, grace: int = 0) -> None:
        sel = f"{L.TRAINING}={name}"
        with contextlib.suppress(ApiError):
            await self.kc.delete(f"{self.api}/pods", {"apiVersion": "v1", "kind": "DeleteOptions",
                                                      "gracePeriodSeconds": grace}, labelSelector=sel)
        while True:  # until the watch has seen them go
            seen = self.pods.version
            if self.pods.ready and not self._pods_of(name):
                return
            await self.pods.wait_past(seen, self.poll_s * 10)

    async def control(self, name: str, what: str, reason: str = "") -> None:
        """suspend | resume | delete (the REST API's requests; ``reason``: why a suspend
        was asked, when not by a user)."""
        if what == "resume":
            await self.launch(name, resumed=True)
            return
        self._busy.add(name)
        try:
            await self._delete_pods(name)
            if what == "delete":
                for path in (f"services/{name}", f"persistentvolumeclaims/{checkpoint_claim(name)}",
                             f"secrets/{attach.secret_name(name)}"):
                    with contextlib.suppress(ApiError):
                        await self.kc.delete(f"{self.api}/{path}")
        finally:
            self._busy.discard(name)
        if what == "delete":
            with self.Session() as s:
                t = s.get(TrainingRow, name)
                for row in (t, s.get(WorkloadRow, name)):
                    if row is not None:
                        s.delete(row)
                if t is not None:
                    add_event(s, "deleted", f"training {name} deleted", name, t.project)
                s.commit()
        else:
            self._set(name, "Suspended", reason or "suspended by a user", "suspended",
                      workload_state="stopped")

    async def logs(self, name: str, rank: int, tail: int = 200) -> list[str]:
        return await worker_logs(self.kc, self.namespace, name, rank, tail)

    def _set(self, name: str, status: str, reason: str, event: str | None = None, *,
             workload_state: str | None = None, placement: list | None = None, **fields) -> None:
        with self.Session() as s:
            set_status(s, name, status, reason, event, **fields)
            w = s.get(WorkloadRow, name)
            if w is not None and workload_state is not None:
                if workload_state == "running" and w.state != "running":
                    w.start_time = time.time()  # this run's start: a maximum runtime counts from it
                w.state = workload_state
                w.reason = reason
                w.placement = placement or []
            s.commit()
