"""The Kubernetes adapter's binder: the only part that writes to the API server.

* Binds, per pod: its WaitForFirstConsumer claims get the chosen node and are waited for
  until Bound (volumes.py), then the fraction's ConfigMap, then the Binding (which stamps
  the placement annotations); a gang's plan is stamped on all its pods first, so a scheduler that restarts
  half-way completes it. A failed bind forgets the watcher's assumption and the pod waits
  again.
* Evictions: pod deletes with the workload's grace period, plus an Event.
* Pending: PodScheduled=False and an Event with the core's reason, at most every
  ``pending_report_s`` per workload, and only once no bind is in flight: binds go first.
* Each Project's status: allocated GPUs, fair share, pending work, over-quota lag.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from collections.abc import Callable

from ..model import MILLI, Decisions, PodPlacement
from ..quota import OverQuotaLedger
from .client import ApiError, KubeClient
from .config import GROUP, NET_ERRORS, AdapterConfig, pod_path
from .objects import (
    PodRequest,
    binding,
    event,
    fraction_config_map,
    placement_annotations,
    preemption_mark,
    rfc3339,
    scheduled_condition,
)
from .watcher import Watcher

__all__ = ["Binder"]

log = logging.getLogger("gpupool.k8s")


class Binder:
    def __init__(self, kc: KubeClient, cfg: AdapterConfig, cache: Watcher,
                 stats: defaultdict[str, int]):
        self.kc = kc
        self.cfg = cfg
        self.cache = cache
        self.stats = stats
        self.reported: dict[str, tuple[str, float]] = {}  # workload -> (reason, when)
        self._bind_sem = asyncio.Semaphore(self.cfg.bind_concurrency)
        self._status_sem = asyncio.Semaphore(self.cfg.status_concurrency)
        self._reports: dict[str, list[tuple[str, str, str, bool]]] = {}  # pod key -> reports due
        self.tasks: set[asyncio.Task] = set()
        # Pending reasons and Events wait while binds are in flight: binds go first.
        self._binding = 0
        self._binds_idle = asyncio.Event()
        self._binds_idle.set()

    def _spawn(self, coro) -> None:
        t = asyncio.create_task(coro)
        self.tasks.add(t)
        t.add_done_callback(self.tasks.discard)

    # ------------------------------------------------------------------------ binds
    def bind(self, wname: str, pairs: list[tuple[PodRequest, PodPlacement]], over_quota: bool) -> None:
        """Bind a workload's pods (already assumed in the watcher) in the background."""
        self._binding += 1
        self._binds_idle.clear()
        self._spawn(self._bind(wname, pairs, over_quota))

    async def _bind(self, wname: str, pairs: list[tuple[PodRequest, PodPlacement]],
                    over_quota: bool) -> None:
        try:
            await self._bind_all(wname, pairs, over_quota)
        finally:
            self._binding -= 1
            if self._binding <= 0:
                self._binding = 0
                self._binds_idle.set()

    async def _bind_all(self, wname: str, pairs: list[tuple[PodRequest, PodPlacement]],
                        over_quota: bool) -> None:
        gang = len(pairs) > 1
        try:
            if gang:
                # Stamp the whole gang's plan first: a scheduler that restarts half-way
                # finds the plan on the unbound pods and completes it (all or nothing).
                await asyncio.gather(*(self._stamp(p, pl, over_quota) for p, pl in pairs))
                results = await asyncio.gather(*(self._bind_pod(p, pl, over_quota)
                                                 for p, pl in pairs), return_exceptions=True)
            else:  # one pod (most binds): no gather, no second task
                await self._bind_pod(*pairs[0], over_quota)
                results = []
        except Exception as e:  # any failure: forget the assumption, the pod waits again
            results = [e]
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed:
            log.warning("binding %s failed: %s", wname, failed[0])
            self.stats["bind_failures"] += 1
            self.cache.unassume(wname, (p for p, _ in pairs))

    async def _stamp(self, pod: PodRequest, pl: PodPlacement, over_quota: bool) -> None:
        async with self._bind_sem:
            await self.kc.patch(pod_path(pod.namespace, pod.name),
                                {"metadata": {"annotations": placement_annotations(pl, over_quota)}})

    async def _bind_pod(self, pod: PodRequest, pl: PodPlacement, over_quota: bool) -> None:
        if pod.claims:  # outside the semaphore: provisioning must not hold up other binds
            await self.cache.volumes.prebind(self.kc, pod.namespace, pod.claims, pl.node,
                                             self.cfg.volume_bind_timeout_s)
        reserved = None
        if pod.demand.is_fractional and self.cfg.gpu_reservations:
            cfg = self.cfg
            reserved = await self.cache.reservations.ensure(
                self.kc, pl.node, pl.gpu_indices[0], cfg.reservation_namespace, cfg.reservation_image,
                cfg.reservation_service_account, cfg.reservation_timeout_s, cfg.reservation_command)
        async with self._bind_sem:
            if pod.demand.is_fractional:
                node = self.cache.snap.nodes.get(pl.node)
                if node is None:
                    raise ApiError(404, f"node {pl.node} went away")
                cm = fraction_config_map(pod, pl, node, self.cfg.preload_path, reserved)
                # one of that name is left by a crash: replaced
                await self.kc.apply(f"/api/v1/namespaces/{pod.namespace}/configmaps", cm)
            try:
                await self.kc.request("POST", pod_path(pod.namespace, pod.name, "binding"),
                                      binding(pod, pl, over_quota), decode=False)
                self.stats["binds"] += 1
            except ApiError as e:
                if e.status == 409:  # already bound (a previous life of this scheduler)
                    live = await self.kc.get(pod_path(pod.namespace, pod.name))
                    self.cache.on_pod("MODIFIED", live)
                    return
                raise

    # -------------------------------------------------------------------- evictions
    def evict(self, pod: PodRequest, reason: str, grace_s: float) -> None:
        self._spawn(self._evict(pod, reason, grace_s))

    async def _evict(self, pod: PodRequest, reason: str, grace_s: float) -> None:
        grace = max(0, round(grace_s))
        message = f"{reason} (grace period {grace}s)"
        async with self._bind_sem:
            try:
                # marked first: the pod's last state says why it went (contract.preempted)
                await self.kc.patch(pod_path(pod.namespace, pod.name, "status"),
                                    preemption_mark(message), kind="strategic")
                await self.kc.delete(pod_path(pod.namespace, pod.name),
                                     {"apiVersion": "v1", "kind": "DeleteOptions",
                                      "gracePeriodSeconds": grace})
                self.stats["evictions"] += 1
            except ApiError as e:
                if e.status != 404:
                    log.warning("evicting %s: %s", pod.key, e)
                    self.cache.evicting.discard(pod.workload)
                    self.cache.refresh(pod.workload)  # still running: a victim again
                return
        self.report(pod.namespace, pod.name, pod.uid, "Preempted", message, condition=False)

    # ---------------------------------------------------------------------- reports
    def report_workload(self, wname: str, reason: str, message: str, *, force: bool = False,
                        now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        last = self.reported.get(wname)
        if not force and last is not None and (
            last[0] == message or now - last[1] < self.cfg.pending_report_s
        ):
            return
        self.reported[wname] = (message, now)
        for key in sorted(self.cache.members.get(wname, ())):
            p = self.cache.pods[key]
            if p.node is None:
                self.report(p.namespace, p.name, p.uid, reason, message)

    def report_changed(self, wname: str, reason: str, message: str) -> None:
        """Report unless ``message`` is the one last reported for the workload (no rate limit)."""
        last = self.reported.get(wname)
        self.report_workload(wname, reason, message, force=not last or last[0] != message)

    def forget(self, wname: str) -> None:
        """The workload is gone or bound: what was reported for it no longer holds."""
        self.reported.pop(wname, None)

    def report(self, ns: str, name: str, uid: str, reason: str, message: str,
               condition: bool = True) -> None:
        """PodScheduled=False (unless not ``condition``) and an Event, in the background.
        One writer per pod, in the order reported: two patches of one pod in flight at once
        may land in either order, and an older reason would stay on the pod."""
        key = f"{ns}/{name}"
        queue = self._reports.get(key)
        if queue is not None:
            queue.append((uid, reason, message, condition))
            return
        self._reports[key] = [(uid, reason, message, condition)]
        self._spawn(self._write_reports(ns, name))

    async def _write_reports(self, ns: str, name: str) -> None:
        key = f"{ns}/{name}"
        queue = self._reports[key]
        try:
            await self._binds_idle.wait()
            async with self._status_sem:
                while queue:
                    uid, reason, message, condition = queue.pop(0)
                    # a later condition replaces this one: only its Event is written
                    newer = any(c for *_, c in queue)
                    try:
                        if condition and not newer:
                            await self.kc.patch(pod_path(ns, name, "status"),
                                                scheduled_condition(reason, message), kind="strategic")
                        await self.kc.post(f"/api/v1/namespaces/{ns}/events",
                                           event(ns, name, uid, "FailedScheduling"
                                                 if reason == "Unschedulable" else reason, message))
                    except ApiError as e:
                        if e.status != 404:
                            log.warning("reporting on %s/%s: %s", ns, name, e)
                    except NET_ERRORS as e:
                        log.warning("reporting on %s/%s: %s", ns, name, e)
        finally:
            del self._reports[key]

    # ------------------------------------------------------------- GPU reservations
    async def reservation_loop(self) -> None:
        """Every ``project_status_s``: delete the reservations whose slot holds no fraction."""
        while True:
            await asyncio.sleep(self.cfg.project_status_s)
            cache = self.cache
            in_use = set()
            for p in cache.pods.values():
                pl = cache.placement(p)
                if pl is not None and p.demand.is_fractional and not p.done:
                    in_use.add((pl.node, pl.gpu_indices[0]))
            for obj in cache.reservations.unused(in_use):
                m = obj["metadata"]
                try:
                    await self.kc.delete(pod_path(m["namespace"], m["name"]),
                                         {"apiVersion": "v1", "kind": "DeleteOptions",
                                          "preconditions": {"uid": m["uid"]}, "gracePeriodSeconds": 0})
                except ApiError as e:
                    if e.status not in (404, 409):
                        log.warning("deleting reservation %s: %s", m["name"], e)
                except NET_ERRORS as e:
                    log.warning("deleting reservation %s: %s", m["name"], e)

    # --------------------------------------------------------------- project status
    async def project_status_loop(self, last: Callable[[], Decisions | None],
                                  ledger: OverQuotaLedger) -> None:
        """Every ``project_status_s``: each Project's status, written when it changed."""
        snap = self.cache.snap
        written: dict[str, dict] = {}
        while True:
            await asyncio.sleep(self.cfg.project_status_s)
            decisions = last()
            fair = decisions.fair_share_milli if decisions else {}
            # at the rates of the last cycle (exact); empty when fair share over time is off
            lag = ledger.lag_at(time.time(), snap.config.fair_share_over_time)
            for name in list(snap.projects):
                status = {
                    "allocated": {pool: u / MILLI for (p, pool), u in snap.usage.items()
                                  if p == name},
                    "fairShare": {pool: m / MILLI for (p, pool), m in fair.items() if p == name},
                    "pending": sum(1 for w in snap.pending.values() if w.project == name),
                    # whole GPU-seconds: the lag changes every instant, the status need not
                    "overQuotaLagGpuSeconds": {pool: round(x / MILLI) for (p, pool), x in lag.items()
                                               if p == name},
                }
                if written.get(name) == status:
                    continue
                # when the lag was read: a scheduler that takes over decays it from then on
                stamped = {**status, "overQuotaLagAt": rfc3339(time.time())}
                try:
                    await self.kc.patch(f"{GROUP}/projects/{name}/status", {"status": stamped})
                    written[name] = status
                except (ApiError, *NET_ERRORS) as e:
                    log.debug("project %s status: %s", name, e)
