"""The embedded adapter: the scheduler loop inside the hub process.

A thin loop around the pure core. It keeps a ``Snapshot`` in step with the database,
calls ``decide`` every period or when poked, and applies the decisions:

* bind: record the placement (snapshot + database) and hand it to whoever launches the
  workload (a waiting spawner, or the process launcher for trainings and inferences);
* evict: mark the workload releasing, SIGTERM its process, SIGKILL after the grace
  period; once it has exited, requeue it (trainings) or drop it (workspaces);
* pending: write the reason and queue position where the spawn progress can read them.

The store is a narrow protocol (``Store``) so tests can run the loop on a fake.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

from ..contract import share_env
from ..core import decide
from ..metrics import prometheus
from ..model import (
    MILLI,
    Bind,
    Decisions,
    Department,
    Evict,
    Node,
    PodPlacement,
    Project,
    State,
    ValidationError,
    Workload,
)
from ..quota import OverQuotaLedger, waiting_over_quota
from ..snapshot import SchedulerConfig, Snapshot

log = logging.getLogger("gpupool.embedded")


class Store(Protocol):
    """What the loop needs from the database."""

    def version(self) -> int: ...
    def load_org(self) -> tuple[list[Department], list[Project]]: ...
    def load_workloads(self) -> list[Workload]: ...
    def record(self, decisions: Decisions, snapshot: Snapshot) -> None: ...
    def set_state(self, name: str, state: str, **fields) -> None: ...
    def event(self, kind: str, message: str, workload: str = "", project: str = "") -> None: ...
    def finish_stop(self, name: str) -> None: ...  # asked to stop, nothing runs it: stopped


# A launcher runs a bound workload and can be asked to stop it (eviction).
Evictor = Callable[[float], Awaitable[None]]


@dataclass
class Waiter:
    bound: asyncio.Future
    evict: Evictor | None = None
    updates: asyncio.Queue = field(default_factory=asyncio.Queue)


def gpu_env(node: Node, pod: PodPlacement, demand_memory_mib: int, preload: str, region: str) -> dict:
    """Environment of a process placed on ``pod``: visible GPUs, the memory cap for the
    interception library, its shared account ``region`` (the launcher's, which creates it
    owned by the workload's account: hub_ext/host/regions.py), and LD_PRELOAD when the
    library is built."""
    gpus = [node.gpus[i] for i in pod.gpu_indices]
    ids = [g.uuid if g.uuid and not g.uuid.startswith("GPU-declared") else str(g.index) for g in gpus]
    env = {
        "CUDA_VISIBLE_DEVICES": ",".join(ids),
        "NVIDIA_VISIBLE_DEVICES": ",".join(ids),
        "GPUPOOL_NODE": node.name,
        "GPUPOOL_GPU_INDICES": ",".join(str(i) for i in pod.gpu_indices),
        "GPUPOOL_GPU_MILLI": str(pod.gpu_milli),
        "GPUPOOL_GPU_FRACTION": f"{pod.gpu_milli / MILLI:g}",
    }
    if gpus and pod.gpu_milli < MILLI:
        # The interception library's interface (native/README.md): memory cap per device,
        # share of SM time, and a shared account file per workload.
        env.update(share_env(gpus[0].memory_mib, pod.gpu_milli, demand_memory_mib))
        env["GPUPOOL_SHARED_REGION"] = region
        if preload and os.path.exists(preload):
            env["LD_PRELOAD"] = preload
    return env


class EmbeddedScheduler:
    def __init__(self, store: Store, nodes: list[Node], period_s: float = 2.0,
                 config: SchedulerConfig | None = None):
        self.store = store
        self.period_s = period_s
        self.snapshot = Snapshot(config or SchedulerConfig())
        # Over-quota lag per project (fair share over time): what ran, kept here, read by
        # the core from the snapshot.
        self.ledger = OverQuotaLedger(self.snapshot.config.fair_share_half_life_s)
        for n in nodes:
            self.snapshot.add_node(n)
        self.waiters: dict[str, Waiter] = {}
        self.launch: Callable[[Workload, Bind], Awaitable[Evictor | None]] | None = None
        self.last: Decisions = Decisions()
        self._version = -1
        # Queues left out of scheduling for a stored value the model refuses: name -> why.
        self.isolated_departments: dict[str, str] = {}
        self.isolated_projects: dict[str, str] = {}
        self._poke = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._lock = asyncio.Lock()

    # -- lifecycle -----------------------------------------------------------------------
    def start(self) -> None:
        if self._task is None:
            prometheus.SNAPSHOT.watch(lambda: (self.snapshot, self.last))
            prometheus.LEADER.set(1)
            self._task = asyncio.ensure_future(self._loop())

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            self._task = None

    def poke(self) -> None:
        self._poke.set()

    async def _loop(self) -> None:
        while True:
            try:
                await asyncio.wait_for(self._poke.wait(), self.period_s)
            except asyncio.TimeoutError:
                pass
            self._poke.clear()
            try:
                await self.cycle()
            except Exception:  # keep scheduling whatever one cycle hit
                log.exception("scheduler cycle failed")

    # -- the spawner's side --------------------------------------------------------------
    def submit(self, w: Workload, evict: Evictor | None = None) -> Waiter:
        """Queue a workload the caller launches itself; the waiter's future gets the Bind.
        Raises ValidationError for a workload the cluster can never hold."""
        w.state = State.PENDING
        w.placement = ()
        self.snapshot.upsert_workload(w)
        waiter = self.waiters[w.name] = Waiter(asyncio.get_running_loop().create_future(), evict)
        self.poke()
        return waiter

    def adopt(self, w: Workload, evict: Evictor) -> Waiter:
        """Hold again a workload that kept running through a hub restart: ``w`` in state
        running at its stored placement; ``evict`` stops it when the core evicts it."""
        self.snapshot.upsert_workload(w)
        waiter = self.waiters[w.name] = Waiter(asyncio.get_running_loop().create_future(), evict)
        waiter.bound.set_result(Bind(w.name, w.placement, w.over_quota))
        self.poke()
        return waiter

    def release(self, name: str, reason: str = "stopped") -> None:
        """The workload has stopped: its GPUs go back to the pool at once."""
        w = self.snapshot.workloads.get(name)
        self.snapshot.remove_workload(name)
        waiter = self.waiters.pop(name, None)
        if waiter and not waiter.bound.done():
            waiter.bound.cancel()
        if w is not None:
            self.store.event("released", f"{name} released its GPUs ({reason})", name, w.project)
        self.poke()

    # -- one cycle -----------------------------------------------------------------------
    async def cycle(self) -> Decisions:
        async with self._lock:
            t0 = time.perf_counter()
            self._sync()
            self.snapshot.now = time.time()
            keep_lag = self.snapshot.config.fair_share_over_time
            self.snapshot.over_quota_lag = self.ledger.lag_at(self.snapshot.now, keep_lag)
            decisions = decide(self.snapshot)
            self._explain_isolated(decisions)
            self.last = decisions
            for b in decisions.binds:
                await self._bind(b)
            for e in decisions.evictions:
                self._evict(e)
            if keep_lag:
                self.ledger.observe(self.snapshot.projects, self.snapshot.usage, waiting_over_quota(self.snapshot))
            self.store.record(decisions, self.snapshot)
            prometheus.observe_cycle(self.snapshot, decisions, time.perf_counter() - t0)
            for p in decisions.pending:
                waiter = self.waiters.get(p.workload)
                if waiter is not None:
                    waiter.updates.put_nowait(p)
            return decisions

    def _sync(self) -> None:
        """Take in what the service changed: organisation, new and deleted workloads."""
        v = self.store.version()
        if v == self._version:
            return
        self._version = v
        depts, projects = self.store.load_org()
        self._sync_org(depts, projects)
        stored = {w.name: w for w in self.store.load_workloads()}
        for name in list(self.snapshot.workloads):
            if name in stored:
                continue
            waiter = self.waiters.get(name)
            if waiter is None:  # nothing of ours runs it: its GPUs are free now
                self.snapshot.remove_workload(name)
                self.store.finish_stop(name)
            elif waiter.evict is not None:  # asked to stop through the API: end it
                evict, waiter.evict = waiter.evict, None
                asyncio.ensure_future(evict(self.snapshot.workloads[name].grace_period_s))
        for name, w in stored.items():
            if name in self.snapshot.workloads or name in self.waiters:
                continue
            try:
                self.snapshot.upsert_workload(w)
            except ValidationError as e:
                self.store.set_state(name, "failed", reason=str(e))

    def _sync_org(self, depts: list[Department], projects: list[Project]) -> None:
        """Put the organisation in the snapshot. A queue with a value the model refuses
        (stored by an older release or by hand) is left out with the reason, and so are the
        projects of such a department: the cycle goes on for everyone else, and the left-out
        projects' pending work says why it waits (``_explain_isolated``)."""
        bad_depts: dict[str, str] = {}
        bad_projects: dict[str, str] = {}
        for name in set(self.snapshot.projects) - {p.name for p in projects}:
            self.snapshot.remove_project(name)
        for d in depts:
            try:
                self.snapshot.set_department(d)
            except ValidationError as e:
                bad_depts[d.name] = f"department {d.name} is left out of scheduling: {e}"
        for p in projects:
            try:
                if p.department in bad_depts:
                    bad_projects[p.name] = bad_depts[p.department]
                else:
                    self.snapshot.set_project(p)
                    continue
            except ValidationError as e:
                bad_projects[p.name] = f"project {p.name} is left out of scheduling: {e}"
            self.snapshot.remove_project(p.name)
        kept = {d.name for d in depts} - set(bad_depts)
        for name in set(self.snapshot.departments) - kept:
            try:
                self.snapshot.remove_department(name)
            except ValidationError:
                pass
        for kind, now, before in (("department", bad_depts, self.isolated_departments),
                                  ("project", bad_projects, self.isolated_projects)):
            for name, why in now.items():
                if before.get(name) != why:
                    log.warning("%s", why)
                    self.store.event("isolated", why, project=name if kind == "project" else "")
            for name in set(before) - set(now):
                self.store.event("restored", f"{kind} {name} is scheduled again",
                                 project=name if kind == "project" else "")
        self.isolated_departments, self.isolated_projects = bad_depts, bad_projects

    def _explain_isolated(self, decisions: Decisions) -> None:
        """The pending work of a left-out project waits for the reason it was left out."""
        if not self.isolated_projects:
            return
        for i, p in enumerate(decisions.pending):
            w = self.snapshot.workloads.get(p.workload)
            why = self.isolated_projects.get(w.project) if w is not None else None
            if why is not None:
                decisions.pending[i] = dataclasses.replace(p, reason=why)

    async def _bind(self, b: Bind) -> None:
        w = self.snapshot.workloads[b.workload]
        w.state, w.placement, w.over_quota = State.RUNNING, b.pods, b.over_quota
        w.started_at = time.time()
        self.snapshot.upsert_workload(w)
        where = "; ".join(f"{p.node} GPU {','.join(map(str, p.gpu_indices))} "
                          f"({p.gpu_milli / MILLI:g} each)" for p in b.pods)
        self.store.event("placed", f"{w.name} placed on {where}"
                         f"{' over quota' if b.over_quota else ''}", w.name, w.project)
        waiter = self.waiters.get(w.name)
        if waiter is not None:
            if not waiter.bound.done():
                waiter.bound.set_result(b)
            return
        if self.launch is not None:
            evict = await self.launch(w, b)
            if evict is not None:
                self.waiters[w.name] = Waiter(asyncio.get_running_loop().create_future(), evict)
                self.waiters[w.name].bound.set_result(b)

    def _evict(self, e: Evict) -> None:
        w = self.snapshot.workloads.get(e.workload)
        if w is None:
            return
        w.state = State.RELEASING
        self.snapshot.upsert_workload(w)
        self.store.event("preempted", f"{w.name} evicted: {e.reason}", w.name, w.project)
        self.store.set_state(w.name, "releasing", reason=e.reason)
        waiter = self.waiters.get(w.name)
        if waiter is not None and waiter.evict is not None:
            asyncio.ensure_future(waiter.evict(e.grace_period_s))
        else:  # nothing of ours runs it (e.g. left over from a restart): requeue now
            self.requeue(w.name)

    def requeue(self, name: str) -> None:
        """After an evicted workload has exited: back to pending with its spec."""
        w = self.snapshot.workloads.get(name)
        self.waiters.pop(name, None)
        if w is None:
            return
        w.state, w.placement, w.over_quota = State.PENDING, (), False
        self.snapshot.upsert_workload(w)
        self.store.set_state(name, "pending", placement=[], pid=None)
        self.store.event("requeued", f"{name} gave back its GPUs and waits to be placed again",
                         name, w.project)
        self.poke()


async def terminate(pid: int, grace_s: float, alive: Callable[[], bool]) -> None:
    """SIGTERM a process (group), then SIGKILL once the grace period has passed."""
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pid, sig)
        except (ProcessLookupError, PermissionError):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if not alive():
                return
            await asyncio.sleep(0.2)
