"""The Kubernetes adapter's watcher: the cluster as the core sees it, kept current.

It lists nodes, claims, volumes, StorageClasses, Departments, Projects, gpupool's pods and
every other pod once (``sync``), then applies each watch event to the snapshot (``watches``);
a node reaches the core less what other pods hold on it (other_pods.py), and a workload
with its volumes' node affinity, or not at all while its claims cannot be bound
(volumes.py); an event that changes what the core sees marks
the scheduler dirty. A bound pod's GPUs come from the annotations the scheduler stamped on it
when it bound it, so a restarted scheduler sees every share in use. Binds in flight are
*assumed* here (``assume``, as kube-scheduler's cache does), so the next cycle never reuses
their share until the Binding shows in the pod's watch event, or the bind fails
(``unassume``).

The watcher reads the API server and never writes to it: what it has to say (a pod it cannot
schedule, a gang still gathering its pods, a half-bound gang to finish) goes to its
``Writer``, the binder.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from collections.abc import Coroutine, Iterable
from dataclasses import replace
from typing import Any, Protocol

from ..constraints import NO_CONSTRAINTS, NodeConstraints
from ..model import Node, PodPlacement, Project, State, ValidationError, Workload
from ..snapshot import Snapshot
from .client import ApiError, KubeClient
from .config import GROUP, NET_ERRORS, AdapterConfig
from .objects import (
    PodRequest,
    node_schedulable,
    parse_department,
    parse_node,
    parse_pod,
    parse_project,
    recorded_lag,
    request_signature,
    update_pod,
)
from .other_pods import OtherPods, held_by
from .reservations import LABEL as RESERVATION
from .reservations import Reservations
from .volumes import Volumes

__all__ = ["Watcher", "Writer"]

log = logging.getLogger("gpupool.k8s")


class Writer(Protocol):
    """What the watcher asks of the binder."""

    def report(self, ns: str, name: str, uid: str, reason: str, message: str) -> None: ...
    def report_workload(self, wname: str, reason: str, message: str, *, force: bool = False) -> None: ...
    def report_changed(self, wname: str, reason: str, message: str) -> None: ...
    def forget(self, wname: str) -> None: ...
    def bind(self, wname: str, pairs: list[tuple[PodRequest, PodPlacement]], over_quota: bool) -> None: ...


def _life(p: PodRequest, assumed: tuple[PodPlacement, bool] | None) -> tuple:
    """What of a pod, besides its request, its workload in the snapshot is built from
    (``refresh``); a bind in flight counts as its placement."""
    placement, over_quota = assumed if assumed is not None else (p.placement, p.over_quota)
    return (p.uid, p.workload, placement, p.plan, over_quota, p.deleting, p.done)


class Watcher:
    writer: Writer  # the binder; set before ``sync``

    def __init__(self, kc: KubeClient, cfg: AdapterConfig, snap: Snapshot, dirty: asyncio.Event):
        self.kc = kc
        self.cfg = cfg
        self.snap = snap
        self.dirty = dirty
        self.pods: dict[str, PodRequest] = {}
        self.members: dict[str, set[str]] = defaultdict(set)  # workload -> pod keys
        # pod key -> (placement, over quota) of a bind in flight
        self.assumed: dict[str, tuple[PodPlacement, bool]] = {}
        # pod key -> when we bound it (time.time()): a pod's start until the kubelet's
        # status.startTime is seen (see _started_at)
        self.bound_at: dict[str, float] = {}
        self.evicting: set[str] = set()
        self.bad: dict[str, str] = {}  # pod key -> error reported
        self.node_full: dict[str, Node] = {}  # as the node reports it; the core gets it less:
        self.other = OtherPods()  # what pods gpupool does not schedule hold on each node
        self.volumes = Volumes()  # claims, volumes and classes (volume binding)
        self.reservations = Reservations()  # GPUs reserved for fractions (--gpu-reservations)
        self.claimed: dict[str, set[str]] = {}  # workload -> keys of the claims its pods name
        self.departments: dict[str, object] = {}
        # The over-quota lag the Projects' status held at ``sync`` and when it was recorded
        self.recorded_lag: tuple[dict[tuple[str, str], float], float] | None = None
        self.projects: dict[str, Project] = {}

    # ------------------------------------------------------------------- list, watch
    def _pod_selector(self) -> str:
        return f"spec.schedulerName={self.cfg.scheduler_name}"

    def _other_selector(self) -> str:
        return (f"spec.schedulerName!={self.cfg.scheduler_name},"
                "status.phase!=Succeeded,status.phase!=Failed")

    async def _list(self, path: str, **params) -> tuple[list[dict], str]:
        try:
            return await self.kc.list_all(path, **params)
        except ApiError as e:
            if e.status == 404:  # CRDs not installed yet: nothing to read
                return [], "0"
            raise

    async def sync(self) -> dict[str, str]:
        """List everything once; the resource versions to watch from."""
        rvs = {}
        nodes, rvs["nodes"] = await self._list("/api/v1/nodes")
        for n in nodes:
            self.on_node("ADDED", n)
        for path, handler in self._volume_watches():
            items, rvs[path] = await self._list(path)
            for obj in items:
                handler("ADDED", obj)
        depts, rvs["departments"] = await self._list(f"{GROUP}/departments")
        for d in depts:
            self.on_department("ADDED", d)
        projects, rvs["projects"] = await self._list(f"{GROUP}/projects")
        for p in projects:
            self.on_project("ADDED", p)
        self.recorded_lag = recorded_lag(projects)
        pods, rvs["pods"] = await self._list("/api/v1/pods", fieldSelector=self._pod_selector())
        for p in pods:
            self.on_pod("ADDED", p)
        # After gpupool's own pods: what other pods hold never takes a GPU that ours use
        others, rvs["other_pods"] = await self._list("/api/v1/pods", fieldSelector=self._other_selector())
        for p in others:
            self.on_other_pod("ADDED", p)
        log.info("synced: %d nodes, %d departments, %d projects, %d pods (%d running workloads)",
                 len(self.snap.nodes), len(self.snap.departments), len(self.snap.projects),
                 len(self.pods), len(self.snap.workloads) - len(self.snap.pending))
        return rvs

    def watches(self, rvs: dict[str, str]) -> list[Coroutine[Any, Any, None]]:
        """One watch per resource, from where ``sync`` listed it."""
        return [
            self._watch("/api/v1/nodes", rvs["nodes"], self.on_node),
            self._watch(f"{GROUP}/departments", rvs["departments"], self.on_department),
            self._watch(f"{GROUP}/projects", rvs["projects"], self.on_project),
            self._watch("/api/v1/pods", rvs["pods"], self.on_pod, fieldSelector=self._pod_selector()),
            self._watch("/api/v1/pods", rvs["other_pods"], self.on_other_pod,
                        fieldSelector=self._other_selector()),
            *(self._watch(path, rvs[path], handler) for path, handler in self._volume_watches()),
        ]

    def _volume_watches(self) -> list[tuple[str, Any]]:
        return [("/apis/storage.k8s.io/v1/storageclasses", self.on_storage_class),
                ("/api/v1/persistentvolumes", self.on_volume),
                ("/api/v1/persistentvolumeclaims", self.on_claim)]

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
        if handler == self.on_pod:
            for key, p in list(self.pods.items()):
                if (p.namespace, p.name) not in seen:
                    self.forget_pod(key)
        elif handler == self.on_other_pod:
            for key in list(self.other.pods):
                if tuple(key.split("/", 1)) not in seen:
                    self._other_changed(self.other.set(key, None))
        elif handler in (self.on_claim, self.on_volume, self.on_storage_class):
            # claims, volumes, classes: those gone while the watch was down
            kept = {self.on_claim: self.volumes.claims, self.on_volume: self.volumes.volumes,
                    self.on_storage_class: self.volumes.classes}[handler]
            for obj in list(kept.values()):
                m = obj["metadata"]
                if (m.get("namespace"), m["name"]) not in seen:
                    handler("DELETED", obj)
        elif handler == self.on_node:
            for name in list(self.snap.nodes):
                if (None, name) not in seen:
                    self.snap.remove_node(name)
        return rv

    # ----------------------------------------------------------------------- events
    def _mark(self) -> None:
        self.dirty.set()

    def on_node(self, etype: str, obj: dict) -> None:
        name = obj["metadata"]["name"]
        if etype == "DELETED" or not node_schedulable(obj):
            self.node_full.pop(name, None)
            if name in self.snap.nodes and not self._node_in_use(name):
                self.snap.remove_node(name)
                self._mark()
            return
        try:
            self.node_full[name] = parse_node(obj, self.cfg.node_pool_label)
        except ValidationError as e:
            log.warning("node %s: %s", name, e)
            return
        self._publish_node(name)

    def on_other_pod(self, etype: str, obj: dict) -> None:
        """A pod gpupool does not schedule: what it holds comes off its node."""
        meta = obj["metadata"]
        key = f"{meta.get('namespace')}/{meta['name']}"
        if (meta.get("labels") or {}).get(RESERVATION):
            self.reservations.on_pod(etype, obj)  # the fractions' own GPU: counted by the core
            return
        try:
            held = None if etype == "DELETED" else held_by(obj)
        except ValidationError as e:
            log.warning("pod %s: %s", key, e)
            held = None
        self._other_changed(self.other.set(key, held))

    # A claim, volume or class changed: the workloads whose pods name the claims it touches
    # are rebuilt (their node affinity, or whether they can be placed at all, may change).
    def on_claim(self, etype: str, obj: dict) -> None:
        self._claims_changed({self.volumes.on_claim(etype, obj)})

    def on_volume(self, etype: str, obj: dict) -> None:
        key = self.volumes.on_volume(etype, obj)
        self._claims_changed({key} if key else set())

    def on_storage_class(self, etype: str, obj: dict) -> None:
        self.volumes.on_class(etype, obj)
        self._claims_changed(None)

    def _claims_changed(self, keys: set[str] | None) -> None:
        for wname, claimed in list(self.claimed.items()):
            if keys is None or claimed & keys:
                self.refresh(wname)

    def _other_changed(self, nodes: set[str]) -> None:
        for name in nodes:
            self._publish_node(name)

    def _publish_node(self, name: str) -> None:
        """The node as the core sees it: what it reports less what other pods hold."""
        full = self.node_full.get(name)
        if full is None:
            return
        in_use = max((max(p.placement.gpu_indices, default=-1) + 1 for p in self.pods.values()
                      if p.placement is not None and p.node == name and not p.done), default=0) \
            if name in self.other.on else 0
        node = self.other.usable(full, in_use)
        old = self.snap.nodes.get(name)
        if old is not None and (old.gpus, old.cpu_milli, old.memory_mib, old.pool, old.labels, old.taints) \
                == (node.gpus, node.cpu_milli, node.memory_mib, node.pool, node.labels, node.taints):
            return
        self.snap.add_node(node)
        self._mark()

    def _node_in_use(self, name: str) -> bool:
        # A node that goes NotReady keeps its running workloads' GPUs accounted for.
        return any(p.node == name and not p.done for p in self.pods.values())

    def on_department(self, etype: str, obj: dict) -> None:
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

    def on_project(self, etype: str, obj: dict) -> None:
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

    def on_pod(self, etype: str, obj: dict) -> None:
        meta = obj["metadata"]
        key = f"{meta.get('namespace')}/{meta['name']}"
        if etype == "DELETED":
            self.forget_pod(key)
            return
        old = self.pods.get(key)
        try:
            if old is not None and old.signature == request_signature(obj):
                pod = update_pod(old, obj)
            else:
                pod = parse_pod(obj)
        except ValidationError as e:
            prev = self.bad.get(key)
            self.forget_pod(key)
            msg = self.bad[key] = str(e)
            if prev != msg and not (obj.get("spec") or {}).get("nodeName"):
                self.writer.report(meta["namespace"], meta["name"], meta.get("uid", ""),
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
            self.forget_pod(key)
            old = None
        if old is not None and old.workload != pod.workload:
            self.forget_pod(key)
        self.pods[key] = pod
        self.members[pod.workload].add(key)
        self.refresh(pod.workload)

    def forget_pod(self, key: str) -> None:
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
        self.refresh(pod.workload)

    # ------------------------------------------------------------------ assumptions
    def assume(self, pairs: Iterable[tuple[PodRequest, PodPlacement]], over_quota: bool,
               at: float) -> None:
        """Binds in flight: their pods count as placed, bound at ``at``."""
        for pod, pl in pairs:
            self.assumed[pod.key] = (pl, over_quota)
            self.bound_at[pod.key] = at

    def unassume(self, wname: str, pods: Iterable[PodRequest]) -> None:
        """A failed bind: its pods wait again."""
        for p in pods:
            self.assumed.pop(p.key, None)
            self.bound_at.pop(p.key, None)
        self.refresh(wname)

    def placement(self, p: PodRequest) -> PodPlacement | None:
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

    # -------------------------------------------------------------------- workloads
    def _with_volumes(self, wname: str, pods: list[PodRequest], first: PodRequest
                      ) -> tuple[NodeConstraints | None, str | None]:
        """The workload's node constraints with its volumes' node affinity, and why its
        claims keep it waiting (None: they do not)."""
        keys = {f"{p.namespace}/{c}" for p in pods for c in p.claims}
        if not keys:
            self.claimed.pop(wname, None)
            return first.constraints, None
        self.claimed[wname] = keys
        groups: list = []
        for p in pods:
            why, more = self.volumes.needs(p.namespace, p.claims)
            if why is not None:
                return first.constraints, why
            groups += [g for g in more if g not in groups]
        if not groups:
            return first.constraints, None
        return replace(first.constraints or NO_CONSTRAINTS, volumes=tuple(groups)), None

    def refresh(self, wname: str) -> None:
        """Rebuild one workload of the snapshot from its pods."""
        pods = sorted((self.pods[k] for k in self.members.get(wname, ())), key=lambda p: p.name)
        pods = [p for p in pods if not p.done]
        old = self.snap.workloads.get(wname)
        if not pods:
            if old is not None:
                self.snap.remove_workload(wname)
                self._mark()
            self.claimed.pop(wname, None)
            self.evicting.discard(wname)
            self.writer.forget(wname)
            return
        first = min(pods, key=lambda p: (p.submit_time, p.name))
        placed = [pl for pl in (self.placement(p) for p in pods) if pl is not None]
        constraints, waits_for = self._with_volumes(wname, pods, first)
        if placed and len(placed) < len(pods):
            # Part of a gang is bound (a scheduler stopped half-way): finish its stamped plan.
            rest = [(p, p.plan) for p in pods if self.placement(p) is None and p.plan is not None and not p.deleting]
            for p, plan in rest:
                self.assume([(p, plan)], p.over_quota, time.time())
            if rest:
                placed += [plan for _, plan in rest]
                self.writer.bind(wname, rest, first.over_quota)
        base: dict[str, Any] = dict(
            name=wname, project=first.project, kind=first.kind, demand=first.demand,
            priority=first.priority, preemptible=first.preemptible,
            allow_over_quota=first.allow_over_quota, node_pool=first.node_pool,
            gpu_models=first.gpu_models, topology_key=first.topology_key, constraints=constraints,
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
            self.writer.report_changed(wname, "Unschedulable", msg)
        elif waits_for is not None:
            w = None  # its claims cannot be bound anywhere yet
            self.writer.report_changed(wname, "Unschedulable", waits_for)
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
                    self.writer.report_workload(wname, "Unschedulable", str(e), force=True)
                else:
                    log.error("cannot account for running %s: %s", wname, e)
        self._mark()
