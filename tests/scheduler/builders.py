"""Fluent builders for scheduler tests: ``make_workload("a").project("nlp").gpus(0.5).obj()``."""

from __future__ import annotations

import dataclasses

from scheduler.model import (
    GPU,
    Department,
    Kind,
    Node,
    PodPlacement,
    Project,
    Quota,
    State,
    Workload,
)
from scheduler.snapshot import SchedulerConfig, Snapshot


def make_node(name: str, gpus: int = 8, model: str = "H100", memory_mib: int = 81920, pool: str = "default",
              cpu_milli: int = 128_000, mem_mib: int = 1 << 20, **labels: str) -> Node:
    return Node(name, [GPU(i, model, memory_mib, f"GPU-{name}-{i}") for i in range(gpus)],
                cpu_milli=cpu_milli, memory_mib=mem_mib, pool=pool, labels=labels)


class WorkloadBuilder:
    def __init__(self, name: str):
        self._w = Workload(name=name, project="p")

    def project(self, p: str) -> WorkloadBuilder:
        self._w.project = p
        return self

    def kind(self, k: Kind) -> WorkloadBuilder:
        self._w.kind = k
        return self

    def gpus(self, n: float) -> WorkloadBuilder:
        d = self._w.demand
        self._w.demand = (dataclasses.replace(d, gpus=int(n)) if n >= 1
                          else dataclasses.replace(d, gpu_fraction=n))
        return self

    def gpu_memory(self, mib: int) -> WorkloadBuilder:
        self._w.demand = dataclasses.replace(self._w.demand, gpu_memory_mib=mib)
        return self

    def cpu(self, milli: int, mem_mib: int = 0) -> WorkloadBuilder:
        self._w.demand = dataclasses.replace(self._w.demand, cpu_milli=milli, memory_mib=mem_mib)
        return self

    def pods(self, n: int) -> WorkloadBuilder:
        self._w.pods = n
        return self

    def priority(self, p: int) -> WorkloadBuilder:
        self._w.priority = p
        return self

    def preemptible(self, v: bool = True) -> WorkloadBuilder:
        self._w.preemptible = v
        return self

    def over_quota(self, v: bool = True) -> WorkloadBuilder:
        self._w.allow_over_quota = v
        return self

    def pool(self, p: str) -> WorkloadBuilder:
        self._w.node_pool = p
        return self

    def models(self, *m: str) -> WorkloadBuilder:
        self._w.gpu_models = tuple(m)
        return self

    def topology(self, key: str) -> WorkloadBuilder:
        self._w.topology_key = key
        return self

    def submitted(self, t: float) -> WorkloadBuilder:
        self._w.submit_time = t
        return self

    def running(self, *pods: tuple[str, tuple[int, ...], int]) -> WorkloadBuilder:
        self._w.state = State.RUNNING
        self._w.placement = tuple(PodPlacement(n, g, m) for n, g, m in pods)
        return self

    def obj(self) -> Workload:
        return self._w


def make_workload(name: str) -> WorkloadBuilder:
    return WorkloadBuilder(name)


def org(*projects: tuple[str, float], dept: str = "d", weights: dict[str, float] | None = None,
        limits: dict[str, float] | None = None, dept_quota: float | None = None, pool: str = "default"):
    """One department holding the given (project, quota) pairs."""
    weights = weights or {}
    limits = limits or {}
    d = Department(dept, {pool: Quota(dept_quota)} if dept_quota is not None else {})
    ps = [Project(name, dept, {pool: Quota(q, weights.get(name, 1.0), limits.get(name))}) for name, q in projects]
    return [d], ps


def snapshot(nodes, departments, projects, workloads=(), **cfg) -> Snapshot:
    return Snapshot.build(nodes, departments, projects, workloads, SchedulerConfig(**cfg))


def apply(snap: Snapshot, decisions, release_evicted: bool = True) -> None:
    """Carry decisions out as an adapter would: bind, and let evicted work exit at once."""
    for b in decisions.binds:
        w = snap.workloads[b.workload]
        snap.upsert_workload(dataclasses.replace(w, state=State.RUNNING, placement=b.pods, over_quota=b.over_quota))
    for e in decisions.evictions:
        w = snap.workloads[e.workload]
        if release_evicted:
            snap.upsert_workload(dataclasses.replace(w, state=State.PENDING, placement=()))
        else:
            snap.upsert_workload(dataclasses.replace(w, state=State.RELEASING))
