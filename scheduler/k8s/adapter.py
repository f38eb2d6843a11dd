"""The Kubernetes adapter: watch, keep the snapshot current, decide, apply.

One ``GpupoolScheduler`` runs while it holds the Lease. Its loop, top to bottom:
  1. sync      list nodes, Departments, Projects and gpupool pods; build the snapshot
               (a bound pod's GPUs come from the annotations the scheduler stamped on it
               when it bound it, so a restarted scheduler sees every share in use)
  2. watch     one task per resource applies each event to the snapshot; an event that
               changes what the core sees marks the scheduler dirty
  3. cycle     when dirty: ``decide(snapshot)`` (pure), then
  4. apply     binds: record the placement in the snapshot at once ("assume", as
               kube-scheduler does, so the next cycle never reuses the share), then per
               pod: the fraction's ConfigMap, then the Binding (which stamps the placement
               annotations); a failed bind forgets the assumption and the pod waits again.
               Evictions: pod deletes with the workload's grace period, plus an Event.
               Pending: PodScheduled=False and an Event with the core's reason.
Only step 4 writes to the API server.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from dataclasses import dataclass, replace
from typing import Any

import aiohttp

from .. import metrics
from ..contract import DEFAULT_PRELOAD, SCHEDULER_NAME, A
from ..core import decide
from ..model import MILLI, Decisions, PodPlacement, Project, State, ValidationError, Workload
from ..quota import OverQuotaLedger, waiting_over_quota
from ..snapshot import SchedulerConfig, Snapshot
from .client import ApiError, KubeClient
from .objects import (
    PodRequest,
    binding,
    event,
    fraction_config_map,
    node_schedulable,
    parse_department,
    parse_node,
    parse_pod,
    parse_project,
    placement_annotations,
    preemption_mark,
    request_signature,
    scheduled_condition,
    update_pod,
)

__all__ = ["AdapterConfig", "GpupoolScheduler"]

log = logging.getLogger("gpupool.k8s")

GROUP = "/apis/gpupool.io/v1alpha1"
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
    core: SchedulerConfig | None = None


def _life(p: PodRequest, assumed: tuple[PodPlacement, bool] | None) -> tuple:
    """What of a pod, besides its request, its workload in the snapshot is built from
    (``_refresh``); a bind in flight counts as its placement."""
    placement, over_quota = assumed if assumed is not None else (p.placement, p.over_quota)
    return (p.uid, p.workload, placement, p.plan, over_quota, p.deleting, p.done)


def _pod_path(ns: str, name: str, sub: str = "") -> str:
    return f"/api/v1/namespaces/{ns}/pods/{name}" + (f"/{sub}" if sub else "")


class GpupoolScheduler:
    def __init__(self, kc: KubeClient, cfg: AdapterConfig | None = None):
        self.kc = kc
        self.cfg = cfg or AdapterConfig()
        self.snap = Snapshot(self.cfg.core or SchedulerConfig())
        self.pods: dict[str, PodRequest] = {}
        self.members: dict[str, set[str]] = defaultdict(set)  # workload -> pod keys
        # pod key -> (placement, over quota) of a bind in flight
        self.assumed: dict[str, tuple[PodPlacement, bool]] = {}
        # pod key -> when we bound it (time.time()): a pod's start until the kubelet's
        # status.startTime is seen (see _started_at)
        self.bound_at: dict[str, float] = {}
        self.evicting: set[str] = set()
        self.reported: dict[str, tuple[str, float]] = {}  # workload -> (reason, when)
        self.bad: dict[str, str] = {}  # pod key -> error reported
        self.departments: dict[str, object] = {}
        self.projects: dict[str, Project] = {}
        self.last: Decisions | None = None
        self.dirty = asyncio.Event()
        self.synced = asyncio.Event()
        self._bind_sem = asyncio.Semaphore(self.cfg.bind_concurrency)
        self._status_sem = asyncio.Semaphore(self.cfg.status_concurrency)
        self._tasks: set[asyncio.Task] = set()
        # Pending reasons and Events wait while binds are in flight: binds go first.
        self._binding = 0
        self._binds_idle = asyncio.Event()
        self._binds_idle.set()
        self.stats: defaultdict[str, int] = defaultdict(int)
        # Over-quota lag per (project, pool) for fair share over time. In memory only: after
        # a restart or a change of leader it starts again from zero.
        self.ledger = OverQuotaLedger(self.snap.config.fair_share_half_life_s)

    # ------------------------------------------------------------------------ 1. sync
    async def run(self, stop: asyncio.Event | None = None) -> None:
        stop = stop or asyncio.Event()
        rvs = await self._initial_sync()
        self.synced.set()
        watchers = [
            asyncio.create_task(self._watch("/api/v1/nodes", rvs["nodes"], self._on_node)),
            asyncio.create_task(self._watch(f"{GROUP}/departments", rvs["departments"],
                                            self._on_department)),
            asyncio.create_task(self._watch(f"{GROUP}/projects", rvs["projects"],
                                            self._on_project)),
            asyncio.create_task(self._watch("/api/v1/pods", rvs["pods"], self._on_pod,
                                            fieldSelector=self._pod_selector())),
            asyncio.create_task(self._project_status_loop()),
        ]
        cycle = asyncio.create_task(self._cycle_loop())
        self.dirty.set()
        done, _ = await asyncio.wait([cycle, asyncio.create_task(stop.wait()), *watchers],
                                     return_when=asyncio.FIRST_COMPLETED)
        for t in [cycle, *watchers, *self._tasks]:
            t.cancel()
        for t in done:
            if not t.cancelled() and (err := t.exception()):
                raise err

    def _pod_selector(self) -> str:
        return f"spec.schedulerName={self.cfg.scheduler_name}"

    async def _list(self, path: str, **params) -> tuple[list[dict], str]:
        try:
            return await self.kc.list_all(path, **params)
        except ApiError as e:
            if e.status == 404:  # CRDs not installed yet: nothing to read
                return [], "0"
            raise

    async def _initial_sync(self) -> dict[str, str]:
        rvs = {}
        nodes, rvs["nodes"] = await self._list("/api/v1/nodes")
        for n in nodes:
            self._on_node("ADDED", n)
        depts, rvs["departments"] = await self._list(f"{GROUP}/departments")
        for d in depts:
            self._on_department("ADDED", d)
        projects, rvs["projects"] = await self._list(f"{GROUP}/projects")
        for p in projects:
            self._on_project("ADDED", p)
        pods, rvs["pods"] = await self._list("/api/v1/pods", fieldSelector=self._pod_selector())
        for p in pods:
            self._on_pod("ADDED", p)
        log.info("synced: %d nodes, %d departments, %d projects, %d pods (%d running workloads)",
                 len(self.snap.nodes), len(self.snap.departments), len(self.snap.projects),
                 len(self.pods), len(self.snap.workloads) - len(self.snap.pending))
        return rvs

    # ----------------------------------------------------------------------- 2. watch
    async def _watch(self, path: str, rv: str, handler, **params) -> None:
        while True:
            try:
                async for ev in self.kc.watch(path, rv, **params):
                    obj = ev["object"]
                    rv = obj["metadata"]["resourceVersion"]
                    if ev["type"] != "BOOKMARK":
                        try:
                            handler(ev["type"], obj)
                        except Exception:  # one odd object must not end the watch
                            log.exception("handling %s %s", ev["type"], path)
            except ApiError as e:
                if e.status == 410:  # too old: list again and reconcile
                    rv = await self._relist(path, handler, **params)
                elif e.status == 404:
                    await asyncio.sleep(2)
                    rv = await self._relist(path, handler, **params)
                else:
                    log.warning("watch %s: %s", path, e)
                    await asyncio.sleep(1)
            except NET_ERRORS as e:
                log.warning("watch %s: %s", path, e)
                await asyncio.sleep(1)

    async def _relist(self, path: str, handler, **params) -> str:
        items, rv = await self._list(path, **params)
        seen = set()
        for obj in items:
            m = obj["metadata"]
            seen.add((m.get("namespace"), m["name"]))
            handler("MODIFIED", obj)
        if handler == self._on_pod:
            for key, p in list(self.pods.items()):
                if (p.namespace, p.name) not in seen:
                    self._forget_pod(key)
        elif handler == self._on_node:
            for name in list(self.snap.nodes):
                if (None, name) not in seen:
                    self.snap.remove_node(name)
        return rv

    def _mark(self) -> None:
        self.dirty.set()

    def _on_node(self, etype: str, obj: dict) -> None:
        name = obj["metadata"]["name"]
        if etype == "DELETED" or not node_schedulable(obj):
            if name in self.snap.nodes and not self._node_in_use(name):
                self.snap.remove_node(name)
                self._mark()
            return
        try:
            node = parse_node(obj, self.cfg.node_pool_label)
        except ValidationError as e:
            log.warning("node %s: %s", name, e)
            return
        old = self.snap.nodes.get(name)
        if old is not None and (old.gpus, old.cpu_milli, old.memory_mib, old.pool, old.labels) \
                == (node.gpus, node.cpu_milli, node.memory_mib, node.pool, node.labels):
            return
        self.snap.add_node(node)
        self._mark()

    def _node_in_use(self, name: str) -> bool:
        # A node that goes NotReady keeps its running workloads' GPUs accounted for.
        return any(p.node == name and not p.done for p in self.pods.values())

    def _on_department(self, etype: str, obj: dict) -> None:
        d = parse_department(obj)
        if etype != "DELETED" and self.departments.get(d.name) == d:
            return  # a status write (ours, every few seconds): nothing the core reads
        if etype == "DELETED":
            self.departments.pop(d.name, None)
            try:
                self.snap.remove_department(d.name)
            except ValidationError as e:
                log.warning("%s", e)
        else:
            self.departments[d.name] = d
            try:
                self.snap.set_department(d)
            except ValidationError as e:
                log.warning("%s", e)
        self._apply_projects()
        self._mark()

    def _on_project(self, etype: str, obj: dict) -> None:
        p = parse_project(obj)
        if etype != "DELETED" and self.projects.get(p.name) == p:
            return  # our own status write (allocated, fair share): nothing the core reads
        if etype == "DELETED":
            self.projects.pop(p.name, None)
            self.snap.remove_project(p.name)
        else:
            self.projects[p.name] = p
        self._apply_projects()
        self._mark()

    def _apply_projects(self) -> None:
        # A project waits in self.projects until its department exists.
        for p in self.projects.values():
            if p.department in self.snap.departments and self.snap.projects.get(p.name) != p:
                try:
                    self.snap.set_project(p)
                except ValidationError as e:
                    log.warning("%s", e)

    def _on_pod(self, etype: str, obj: dict) -> None:
        meta = obj["metadata"]
        key = f"{meta.get('namespace')}/{meta['name']}"
        if etype == "DELETED":
            self._forget_pod(key)
            return
        old = self.pods.get(key)
        try:
            if old is not None and old.signature == request_signature(obj):
                pod = update_pod(old, obj)
            else:
                pod = parse_pod(obj)
        except ValidationError as e:
            prev = self.bad.get(key)
            self._forget_pod(key)
            msg = self.bad[key] = str(e)
            if prev != msg and not (obj.get("spec") or {}).get("nodeName"):
                self._report(meta["namespace"], meta["name"], meta.get("uid", ""),
                             "InvalidRequest", f"gpupool cannot schedule this pod: {msg}")
            return
        self.bad.pop(key, None)
        assumed = self.assumed.get(key)
        if pod.node and assumed is not None:
            del self.assumed[key]  # the bind we made is now visible
            if old is not None and _life(old, assumed) == _life(pod, None):
                self.pods[key] = pod  # where we assumed it: the snapshot has it already
                return
        elif old is not None and _life(old, assumed) == _life(pod, assumed):
            self.pods[key] = pod  # a status update (kwok's, the kubelet's): nothing to redo
            return
        if old is not None and old.uid != pod.uid:  # same name, new pod
            self._forget_pod(key)
            old = None
        if old is not None and old.workload != pod.workload:
            self._forget_pod(key)
        self.pods[key] = pod
        self.members[pod.workload].add(key)
        self._refresh(pod.workload)

    def _forget_pod(self, key: str) -> None:
        pod = self.pods.pop(key, None)
        self.assumed.pop(key, None)
        self.bound_at.pop(key, None)
        self.bad.pop(key, None)
        if pod is None:
            return
        keys = self.members.get(pod.workload)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self.members[pod.workload]
        self._refresh(pod.workload)

    def _placement(self, p: PodRequest) -> PodPlacement | None:
        a = self.assumed.get(p.key)
        return a[0] if a is not None else p.placement

    def _over_quota(self, p: PodRequest) -> bool:
        a = self.assumed.get(p.key)
        return a[1] if a is not None else p.over_quota

    def _started_at(self, pods: list[PodRequest]) -> float | None:
        """When a workload started running: the latest start of its pods, each the
        kubelet's status.startTime, else the time we bound it. startTime is not part of
        ``_life`` (so the status update that adds it does not rebuild the workload): until
        the workload is rebuilt for another reason it keeps the bind time, a few seconds
        earlier, which only shortens the resume protection by as much."""
        times = [p.start_time or self.bound_at.get(p.key) for p in pods]
        known = [t for t in times if t is not None]
        return max(known) if times and len(known) == len(times) else None

    def _refresh(self, wname: str) -> None:
        """Rebuild one workload of the snapshot from its pods."""
        pods = sorted((self.pods[k] for k in self.members.get(wname, ())), key=lambda p: p.name)
        pods = [p for p in pods if not p.done]
        old = self.snap.workloads.get(wname)
        if not pods:
            if old is not None:
                self.snap.remove_workload(wname)
                self._mark()
            self.evicting.discard(wname)
            self.reported.pop(wname, None)
            return
        first = min(pods, key=lambda p: (p.submit_time, p.name))
        placed = [pl for pl in (self._placement(p) for p in pods) if pl is not None]
        if placed and len(placed) < len(pods):
            # Part of a gang is bound (a scheduler stopped half-way): finish its stamped plan.
            rest = [(p, p.plan) for p in pods if self._placement(p) is None and p.plan is not None and not p.deleting]
            for p, plan in rest:
                self.assumed[p.key] = (plan, p.over_quota)
                self.bound_at[p.key] = time.time()
            if rest:
                placed += [plan for _, plan in rest]
                self._binding += 1
                self._binds_idle.clear()
                self._spawn(self._bind(wname, rest, first.over_quota))
        base: dict[str, Any] = dict(
            name=wname, project=first.project, kind=first.kind, demand=first.demand,
            priority=first.priority, preemptible=first.preemptible,
            allow_over_quota=first.allow_over_quota, node_pool=first.node_pool,
            gpu_models=first.gpu_models, topology_key=first.topology_key,
            submit_time=first.submit_time, grace_period_s=first.grace_period_s,
            resumed=first.resumed,
        )  # fmt: skip
        if placed:
            # Evicted pods still hold their GPUs until they are gone: RELEASING tells the core
            # to count them as soon free rather than pick more victims for the same room.
            leaving = wname in self.evicting or any(p.deleting for p in pods)
            w = Workload(**base, pods=len(placed), state=State.RELEASING if leaving else State.RUNNING,
                         placement=tuple(placed), over_quota=any(self._over_quota(p) for p in pods),
                         started_at=self._started_at(pods))
        elif any(p.deleting for p in pods):
            w = None  # on its way out
        elif len(pods) < first.gang_size:
            w = None  # a gang still gathering its pods
            msg = f"gang waits for its pods: {len(pods)} of {first.gang_size} exist"
            last = self.reported.get(wname)
            self._report_workload(wname, "Unschedulable", msg, force=not last or last[0] != msg)
        else:
            w = Workload(**base, pods=first.gang_size)
        if w == old:
            return
        if w is None:
            self.snap.remove_workload(wname)
        else:
            try:
                self.snap.upsert_workload(w)
            except ValidationError as e:
                self.snap.remove_workload(wname)
                if w.state == State.PENDING:
                    self._report_workload(wname, "Unschedulable", str(e), force=True)
                else:
                    log.error("cannot account for running %s: %s", wname, e)
        self._mark()

    # ----------------------------------------------------------------------- 3. cycle
    async def _cycle_loop(self) -> None:
        while True:
            try:
                await asyncio.wait_for(self.dirty.wait(), timeout=self.cfg.resync_s)
            except asyncio.TimeoutError:
                if not self.snap.pending:
                    continue
            await asyncio.sleep(self.cfg.batch_s)
            self.dirty.clear()
            self._advance_clock()
            if not self.snap.pending:
                self._observe_lag()  # usage changed (work ended): the lag's rate from now on
                continue
            t0 = time.perf_counter()
            try:
                decisions = decide(self.snap)
                self.last = decisions
                self.stats["cycles"] += 1
                self._apply(decisions)
                self._observe_lag()
                metrics.observe_cycle(self.snap, decisions, time.perf_counter() - t0)
                self.stats["cycle_ms"] += round(1000 * (time.perf_counter() - t0))
            except Exception:  # a bug must not stop scheduling for good: log, back off, retry
                log.exception("scheduling cycle failed")
                self.stats["cycle_errors"] += 1
                await asyncio.sleep(1.0)
                self.dirty.set()
                continue
            log.debug("cycle: %d binds, %d evictions, %d pending in %.3fs", len(decisions.binds),
                      len(decisions.evictions), len(decisions.pending), time.perf_counter() - t0)
            await asyncio.sleep(0)  # let watch events in before the next cycle

    def _advance_clock(self) -> None:
        """The core keeps no clock: resume protection and fair share over time read the
        adapter's, and the lag the ledger has summed up to it."""
        self.snap.now = time.time()
        self.snap.over_quota_lag = self.ledger.lag_at(self.snap.now, self.snap.config.fair_share_over_time)

    def _observe_lag(self) -> None:
        """After a change of usage or of waiting work: the ledger's rates until the next."""
        if self.snap.config.fair_share_over_time:
            self.ledger.observe(self.snap.projects, self.snap.usage, waiting_over_quota(self.snap))

    # ----------------------------------------------------------------------- 4. apply
    def _spawn(self, coro) -> None:
        t = asyncio.create_task(coro)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)

    def _apply(self, d: Decisions) -> None:
        for b in d.binds:
            w = self.snap.workloads.get(b.workload)
            if w is None or w.state != State.PENDING:
                continue
            pods = [self.pods[k] for k in sorted(self.members.get(b.workload, ()))]
            pods = [p for p in pods if not p.done and not p.deleting and self._placement(p) is None]
            if len(pods) < len(b.pods):
                continue
            pairs = list(zip(pods, b.pods))
            started = time.time()
            for pod, pl in pairs:
                self.assumed[pod.key] = (pl, b.over_quota)
                self.bound_at[pod.key] = started
            self.snap.upsert_workload(replace(w, pods=len(b.pods), state=State.RUNNING,
                                              placement=tuple(b.pods), over_quota=b.over_quota,
                                              started_at=started))
            self.reported.pop(b.workload, None)
            self._binding += 1
            self._binds_idle.clear()
            self._spawn(self._bind(b.workload, pairs, b.over_quota))
        for e in d.evictions:
            self.evicting.add(e.workload)
            self._refresh(e.workload)  # now RELEASING in the snapshot
            for key in sorted(self.members.get(e.workload, ())):
                self._spawn(self._evict(self.pods[key], e.reason, e.grace_period_s))
        now = time.monotonic()
        for p in d.pending:
            self._report_workload(p.workload, "Unschedulable", p.reason, now=now)

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
            for p, _ in pairs:
                self.assumed.pop(p.key, None)
                self.bound_at.pop(p.key, None)
            self._refresh(wname)

    async def _stamp(self, pod: PodRequest, pl: PodPlacement, over_quota: bool) -> None:
        async with self._bind_sem:
            await self.kc.patch(_pod_path(pod.namespace, pod.name),
                                {"metadata": {"annotations": placement_annotations(pl, over_quota)}})

    async def _bind_pod(self, pod: PodRequest, pl: PodPlacement, over_quota: bool) -> None:
        async with self._bind_sem:
            if pod.demand.is_fractional:
                node = self.snap.nodes.get(pl.node)
                if node is None:
                    raise ApiError(404, f"node {pl.node} went away")
                cm = fraction_config_map(pod, pl, node, self.cfg.preload_path)
                # one of that name is left by a crash: replaced
                await self.kc.apply(f"/api/v1/namespaces/{pod.namespace}/configmaps", cm)
            try:
                await self.kc.request("POST", _pod_path(pod.namespace, pod.name, "binding"),
                                      binding(pod, pl, over_quota), decode=False)
                self.stats["binds"] += 1
            except ApiError as e:
                if e.status == 409:  # already bound (a previous life of this scheduler)
                    live = await self.kc.get(_pod_path(pod.namespace, pod.name))
                    self._on_pod("MODIFIED", live)
                    return
                raise

    async def _evict(self, pod: PodRequest, reason: str, grace_s: float) -> None:
        grace = max(0, round(grace_s))
        message = f"{reason} (grace period {grace}s)"
        async with self._bind_sem:
            try:
                # marked first: the pod's last state says why it went (contract.preempted)
                await self.kc.patch(_pod_path(pod.namespace, pod.name, "status"),
                                    preemption_mark(message), kind="strategic")
                await self.kc.delete(_pod_path(pod.namespace, pod.name),
                                     {"apiVersion": "v1", "kind": "DeleteOptions",
                                      "gracePeriodSeconds": grace})
                self.stats["evictions"] += 1
            except ApiError as e:
                if e.status != 404:
                    log.warning("evicting %s: %s", pod.key, e)
                    self.evicting.discard(pod.workload)
                    self._refresh(pod.workload)  # still running: a victim again
                return
        self._report(pod.namespace, pod.name, pod.uid, "Preempted", message, condition=False)

    def _report_workload(self, wname: str, reason: str, message: str, *, force: bool = False,
                         now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        last = self.reported.get(wname)
        if not force and last is not None and (
            last[0] == message or now - last[1] < self.cfg.pending_report_s
        ):
            return
        self.reported[wname] = (message, now)
        for key in sorted(self.members.get(wname, ())):
            p = self.pods[key]
            if p.node is None:
                self._report(p.namespace, p.name, p.uid, reason, message)

    def _report(self, ns: str, name: str, uid: str, reason: str, message: str,
                condition: bool = True) -> None:
        async def go() -> None:
            await self._binds_idle.wait()
            async with self._status_sem:
                try:
                    if condition:
                        await self.kc.patch(_pod_path(ns, name, "status"),
                                            scheduled_condition(reason, message), kind="strategic")
                    await self.kc.post(f"/api/v1/namespaces/{ns}/events",
                                       event(ns, name, uid, "FailedScheduling"
                                             if reason == "Unschedulable" else reason, message))
                except ApiError as e:
                    if e.status != 404:
                        log.warning("reporting on %s/%s: %s", ns, name, e)
                except NET_ERRORS as e:
                    log.warning("reporting on %s/%s: %s", ns, name, e)

        self._spawn(go())

    # ------------------------------------------------------------- project status
    async def _project_status_loop(self) -> None:
        written: dict[str, dict] = {}
        while True:
            await asyncio.sleep(self.cfg.project_status_s)
            fair = self.last.fair_share_milli if self.last else {}
            # at the rates of the last cycle (exact); empty when fair share over time is off
            lag = self.ledger.lag_at(time.time(), self.snap.config.fair_share_over_time)
            for name in list(self.snap.projects):
                status = {
                    "allocated": {pool: u / MILLI for (p, pool), u in self.snap.usage.items()
                                  if p == name},
                    "fairShare": {pool: m / MILLI for (p, pool), m in fair.items() if p == name},
                    "pending": sum(1 for w in self.snap.pending.values() if w.project == name),
                    # whole GPU-seconds: the lag changes every instant, the status need not
                    "overQuotaLagGpuSeconds": {pool: round(x / MILLI) for (p, pool), x in lag.items()
                                               if p == name},
                }
                if written.get(name) == status:
                    continue
                try:
                    await self.kc.patch(f"{GROUP}/projects/{name}/status", {"status": status})
                    written[name] = status
                except (ApiError, *NET_ERRORS) as e:
                    log.debug("project %s status: %s", name, e)
