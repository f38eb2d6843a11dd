"""The event log on Kubernetes: binds, evictions and deletions of the pods gpupool-scheduler
places, seen on the API server, written as the embedded scheduler's events are.

- ``placed`` at the pod's bind (its ``PodScheduled=True`` transition), with the GPUs the
  scheduler gave it (``gpupool.io/gpu-indices`` and ``gpu-milli``): GPU-hours open there;
- ``preempted`` when gpupool-scheduler evicted it: the mark it writes on the pod before its
  delete (``scheduler.contract.preempted``), seen in the pod's last state, never looked up;
- ``released`` at its end: when it is gone after a deletion (at most its
  ``deletionTimestamp``, the end of its grace period), or for a pod that ran to completion
  its containers' last finish. GPU-hours close there.

So GPU-hours on Kubernetes are allocation x time between a pod's bind and its end
(hub_ext/db/accounting.py reads these events). While a one-pod workload (a workspace) waits,
its hub row carries gpupool-scheduler's reason. Allocations are kept per pod: a gang's workers
are ``JOB/RANK``-like keys (the pod's name), one pod workloads their hub workload's name.
"""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import datetime

from sqlalchemy import select

from scheduler.contract import SCHEDULER_NAME, A, preempted, waiting_reason
from scheduler.kubernetes.client import ApiError, KubeClient

from ..db.events import add_event
from ..db.tables import EventRow, WorkloadRow

log = logging.getLogger("gpupool")

__all__ = ["PodEvents", "allocation_key", "bind_time", "end_time", "pod_gpus"]


def _ts(s: str | None) -> float | None:
    if not s:
        return None
    return datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()


def bind_time(pod: dict) -> float | None:
    if not (pod.get("spec") or {}).get("nodeName"):
        return None
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == "PodScheduled" and c.get("status") == "True":
            return _ts(c.get("lastTransitionTime"))
    return None


def end_time(pod: dict, gone_at: float | None = None) -> float | None:
    """When the pod stopped holding its GPUs: its containers' last finish for one that ran
    to completion; else, once it is gone (``gone_at``: when its deletion was seen), that
    time, at most its ``deletionTimestamp`` (the end of its grace period); None while it
    holds them (a pod being deleted holds them until it is gone)."""
    status = pod.get("status") or {}
    if status.get("phase") in ("Succeeded", "Failed"):
        ends = [_ts(((cs.get("state") or {}).get("terminated") or {}).get("finishedAt"))
                for cs in status.get("containerStatuses") or []]
        done = max((e for e in ends if e is not None), default=None)
        if done is not None:
            return done
    if gone_at is None:
        return None
    deadline = _ts(pod["metadata"].get("deletionTimestamp"))
    return gone_at if deadline is None else min(gone_at, deadline)


def pod_gpus(pod: dict) -> tuple[float, list[dict]]:
    ann = pod["metadata"].get("annotations") or {}
    idx = [int(i) for i in (ann.get(A.GPU_INDICES) or "").split(",") if i.strip().isdigit()]
    milli = int(ann.get(A.GPU_MILLI) or 0)
    if not idx:
        return 0.0, []
    return len(idx) * milli / 1000, [{"node": pod["spec"]["nodeName"], "gpu_indices": idx, "gpu_milli": milli}]


def allocation_key(pod: dict) -> str:
    """The event log's workload of a pod: its hub workload, or for a gang worker the pod."""
    ann = pod["metadata"].get("annotations") or {}
    if ann.get(A.GANG):
        return pod["metadata"]["name"]
    return ann.get(A.WORKLOAD) or pod["metadata"]["name"]


class PodEvents:
    """Follows the pods of ``namespace`` that gpupool-scheduler places; one per hub."""

    def __init__(self, kc: KubeClient, Session, namespace: str, scheduler_name: str = SCHEDULER_NAME,
                 resync_s: float = 1.0, relist_s: int = 10):
        self.kc, self.Session, self.namespace = kc, Session, namespace
        self.path = f"/api/v1/namespaces/{namespace}/pods"
        self.scheduler_name = scheduler_name
        self.resync_s, self.relist_s = resync_s, relist_s
        self.seen: dict[str, dict] = {}  # uid -> the last pod seen
        self.done: dict[str, set[str]] = {}  # uid -> event kinds written

    async def run(self) -> None:
        """List, then watch from there (a deleted pod's last state carries its
        ``deletionTimestamp``); list again when the watch ends (every ``relist_s``: a deletion
        the watch missed is seen there, its end at most its ``deletionTimestamp``) or is too
        old."""
        while True:
            try:
                rv = await self.sync()
                async for ev in self.kc.watch(self.path, rv, timeoutSeconds=self.relist_s):
                    if ev.get("type") in ("ADDED", "MODIFIED", "DELETED") and self._ours(ev["object"]):
                        await self.observe(ev["object"], deleted=ev["type"] == "DELETED")
            except asyncio.CancelledError:
                raise
            except ApiError as e:
                if e.status != 410:
                    log.warning("watching the cluster's pods: %s", e)
                    await asyncio.sleep(self.resync_s)
            except Exception:
                log.exception("following the cluster's pods failed")
                await asyncio.sleep(self.resync_s)

    async def sync(self) -> str:
        """Observe every pod now, and the end of those gone since the last look."""
        items, rv = await self.kc.list_all(self.path)
        now = {p["metadata"]["uid"]: p for p in items if self._ours(p)}
        for pod in now.values():
            await self.observe(pod)
        for uid in set(self.seen) - set(now):
            await self.observe(self.seen[uid], deleted=True)
        return rv

    def _ours(self, pod: dict) -> bool:
        return (pod.get("spec") or {}).get("schedulerName") == self.scheduler_name

    async def observe(self, pod: dict, deleted: bool = False) -> None:
        uid = pod["metadata"]["uid"]
        done = self.done.setdefault(uid, set())
        if not deleted:
            self.seen[uid] = pod
        # a deleted pod stays in ``seen`` until its end is written: a write that fails (the
        # database busy) is done again at the next list
        bound = bind_time(pod)
        key, meta = allocation_key(pod), pod["metadata"]
        ann = meta.get("annotations") or {}
        if bound is None:
            if deleted:
                self.done.pop(uid, None)
                self.seen.pop(uid, None)
            elif not ann.get(A.GANG):  # a gang's reason is its controller's
                self._waiting(ann.get(A.WORKLOAD), waiting_reason(pod))
            return
        project, user = ann.get(A.PROJECT, self.namespace), ann.get(A.OWNER) or None
        if "placed" not in done:
            gpus, placement = pod_gpus(pod)
            self._write_once(key, "placed", bound, project, user,
                             f"{key} placed on {pod['spec']['nodeName']}"
                             + (f" GPU {','.join(map(str, placement[0]['gpu_indices']))} "
                                f"({placement[0]['gpu_milli'] / 1000:g} each)" if placement else ""),
                             gpus=gpus, placement=placement)
            if not ann.get(A.GANG):  # a gang's row is its controller's (training/kubernetes.py)
                self._running(ann.get(A.WORKLOAD), placement, bound)
            done.add("placed")
        end = end_time(pod, time.time() if deleted else None)
        if end is not None and "released" not in done:
            if preempted(pod):
                self._write_once(key, "preempted", end, project, user,
                                 f"{key} evicted by gpupool-scheduler")
            self._write_once(key, "released", end, project, user, f"{key} released its GPUs")
            done.add("released")
        if deleted:
            self.done.pop(uid, None)
            self.seen.pop(uid, None)

    def _waiting(self, workload: str | None, reason: str | None) -> None:
        """The hub's row of a one-pod workload waiting for a placement carries the scheduler's
        reason, as in embedded mode (REST, the CLI, the queue and the home page show it)."""
        if not workload or not reason:
            return
        with self.Session() as s:
            w = s.get(WorkloadRow, workload)
            if w is not None and w.state == "pending" and w.reason != reason:
                w.reason = reason
                s.commit()

    def _running(self, workload: str | None, placement: list[dict], since: float) -> None:
        """The hub's row of a one-pod workload (a workspace) is running once its pod is bound."""
        if not workload:
            return
        with self.Session() as s:
            w = s.get(WorkloadRow, workload)
            if w is not None and w.state == "pending":
                w.state, w.placement, w.start_time, w.reason = "running", placement, since, ""
                s.commit()

    def _write_once(self, key: str, kind: str, ts: float, project: str, user: str | None, message: str,
                    **fields) -> None:
        """Written once per (workload, kind, time): a hub restart sees the same pods again."""
        with self.Session() as s:
            if s.scalar(select(EventRow.id).where(EventRow.workload == key, EventRow.kind == kind,
                                                  EventRow.ts == ts)) is not None:
                return
            if user is not None:
                fields["user"] = user
            add_event(s, kind, message, key, project, ts=ts, **fields)
            s.commit()
