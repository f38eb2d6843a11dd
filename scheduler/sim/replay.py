"""Multi-tenant trace replay: the openb pods over time, under three ways to share a cluster.

Each trace pod arrives at its ``creation_time`` (divided by the scenario's arrival
compression), needs ``deletion_time - scheduled_time`` seconds of service once placed, and
leaves. The replay is event-driven: arrivals, finishes and evicted pods' exits change an
incremental ``Snapshot`` (one upsert or remove per event), and a scheduling cycle
(``decide``) runs on the next multiple of the scheduling period after a change, only if
there is pending work. An adapter's part is played here: binds start pods; an eviction
turns the pod ``RELEASING`` for the grace period, then ``PENDING`` again with the work
since its last checkpoint lost; the reclaiming pod binds in a later cycle.

The adapter keeps one queue per project and workload kind and shows the scheduler the
first ``queue_depth`` pods of each (queue order: priority, resumed first, submit time), as
Kueue shows its queue heads: a cycle then costs what the heads cost, not the backlog. Per
kind, so that workspaces held back by their quota never hide the training behind them.
The same depth holds for every policy (fifo-shared's one project sees depth x projects).

The three policies are one core under three organisations (``SETUPS``):
  static       the scenario's projects and quotas; over quota off for every workload, no
               reclaim, no preemption: each team has its own silo of ``quota`` GPUs.
  fifo-shared  one project holding the whole cluster; every workload the same priority and
               non-preemptible, so the queue is by submit time (with backfill), no quotas.
  gpupool      the scenario's projects, quotas and weights with the kinds' defaults:
               guaranteed + over quota by fair share + reclaim + preemption.

Metrics are kept per scenario project for every policy (the teams exist even when the
scheduler does not see them): see ``Meter`` and ``PolicyResult``.
"""

from __future__ import annotations

import bisect
import dataclasses
import heapq
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..core import decide
from ..model import (
    DEFAULT_POOL,
    MILLI,
    Department,
    Evict,
    EvictionCause,
    Kind,
    Node,
    Project,
    Quota,
    State,
    Workload,
)
from ..quota import OverQuotaLedger, waterfill
from ..snapshot import SchedulerConfig, Snapshot
from .scenario import Scenario
from .startable import Holdings
from .trace import TracePod

__all__ = ["POLICY_NAMES", "SETUPS", "PolicyResult", "replay", "replay_all"]


# -- the three policies, as organisations of one core --------------------------------
@dataclass
class Setup:
    """How one policy is expressed through the scheduler core."""

    config: SchedulerConfig
    departments: list[Department]
    projects: list[Project]
    workload: Callable[[Job], Workload]


def _base(job: Job, grace: float, **kw) -> Workload:
    if job.opt_in:  # an "interactive preemptible" workspace (scenario.workspace_over_quota)
        kw = {"preemptible": True, "allow_over_quota": True, **kw}
    return Workload(
        name=job.name,
        project=kw.pop("project", job.project),
        kind=job.kind,
        demand=job.pod.demand,
        submit_time=job.submit,
        grace_period_s=grace,
        **kw,
    )


def setup_static(scn: Scenario, capacity_milli: int, placement: str) -> Setup:
    depts, projects = scn.organisation(capacity_milli)
    cfg = SchedulerConfig(policy=placement, reclaim=False, fair_share_reclaim=False, preempt=False)
    grace = scn.time.eviction_grace_s
    return Setup(cfg, depts, projects, lambda j: _base(j, grace, allow_over_quota=False))


def setup_fifo_shared(scn: Scenario, capacity_milli: int, placement: str) -> Setup:
    q = Quota(capacity_milli / MILLI)
    cfg = SchedulerConfig(policy=placement, reclaim=False, fair_share_reclaim=False, preempt=False)
    grace = scn.time.eviction_grace_s
    return Setup(
        cfg,
        [Department("shared", {"default": q})],
        [Project("shared", "shared", {"default": q})],
        lambda j: _base(j, grace, project="shared", priority=0, preemptible=False),
    )


def setup_gpupool(scn: Scenario, capacity_milli: int, placement: str) -> Setup:
    depts, projects = scn.organisation(capacity_milli)
    grace = scn.time.eviction_grace_s
    return Setup(SchedulerConfig(policy=placement), depts, projects, lambda j: _base(j, grace))


# In the order the table and the chart list them: today's silos, one shared FIFO pool, gpupool.
SETUPS: dict[str, Callable[[Scenario, int, str], Setup]] = {
    "static": setup_static,
    "fifo-shared": setup_fifo_shared,
    "gpupool": setup_gpupool,
}
POLICY_NAMES = tuple(SETUPS)


# -- one trace pod in the replay ------------------------------------------------------
class Job:
    __slots__ = (
        "pod", "name", "project", "kind", "milli", "submit", "service", "remaining",
        "start", "first_start", "finish", "gen", "preemptions", "in_quota", "opt_in", "over_ok",
    )  # fmt: skip

    def __init__(
        self, pod: TracePod, project: str, kind: Kind, submit: float, opt_in: bool = False, service: float | None = None
    ):
        self.pod = pod
        self.name = pod.name
        self.project = project
        self.kind = kind
        self.milli = pod.gpu_request_milli
        self.submit = submit
        self.service = pod.ran_s if service is None else service
        self.remaining = self.service
        self.start: float | None = None
        self.first_start: float | None = None
        self.finish: float | None = None
        self.gen = 0  # bumped on eviction so the old finish event is ignored
        self.preemptions = 0
        self.in_quota = False
        self.opt_in = opt_in and kind == Kind.WORKSPACE  # a workspace that may go over quota
        self.over_ok = kind == Kind.TRAINING or self.opt_in  # work that may run over quota


def make_jobs(pods: list[TracePod], scn: Scenario, nodes: list[Node] | None = None) -> list[Job]:
    """The scenario's pods as jobs, submitted at the scenario's arrival times for them."""
    chosen = scn.select(pods, nodes)
    jobs = []
    for p, submit in zip(chosen, scn.arrival_times(chosen)):
        project = scn.project_of(p.name, submit)
        jobs.append(Job(p, project, scn.kind_of(p, project), submit, scn.opts_over_quota(p.name), scn.service_s(p, project, submit)))
    return jobs


# -- metrics ----------------------------------------------------------------------------
def over_quota_shares(
    held: dict[str, int], pend_over: dict[str, int], quota: dict[str, int], weight: dict[str, float],
    limit: dict[str, int] | None = None,
) -> tuple[list[str], list[float], list[float]] | None:
    """The projects that want over-quota GPUs now (they hold at least their quota, and what
    they hold plus their pending work that may go over quota exceeds it), the over-quota milli each holds, and its
    weighted share of the over-quota milli in use (water-filling by weight, none above what
    it wants). None when fewer than two projects want over-quota GPUs or none are in use."""
    names, want, alloc = [], [], []
    for p, q in quota.items():
        d = held.get(p, 0) + pend_over.get(p, 0) - q
        if limit and p in limit:  # never more than its limit lets it hold (as quota.fair_shares)
            d = min(d, limit[p] - q)
        # Only a project holding its quota competes for over-quota GPUs (record 0052): one
        # below it is short of its quota, which the quota-unserved goal counts.
        if d > 0 and weight[p] > 0 and held.get(p, 0) >= q:
            names.append(p)
            want.append(float(d))
            alloc.append(float(max(0, held.get(p, 0) - q)))
    total = sum(alloc)
    if len(names) < 2 or total <= 0:
        return None
    share = waterfill(total, [0.0] * len(names), want, [weight[p] for p in names])
    return names, alloc, share


def jain_of(x: list[float]) -> float | None:
    return sum(x) ** 2 / (len(x) * sum(v * v for v in x)) if len(x) >= 2 and any(x) else None


def jain(held: dict[str, int], pend_over: dict[str, int], quota: dict[str, int], weight: dict[str, float]) -> float | None:
    """Jain's index at one instant of the projects' over-quota allocations, each divided by
    its weight share (``over_quota_shares``). 1 = every such project holds exactly its
    weighted share. None when fewer than two projects want over-quota GPUs or none are in use."""
    st = over_quota_shares(held, pend_over, quota, weight)
    if st is None:
        return None
    _, alloc, share = st
    x = [a / s for a, s in zip(alloc, share) if s > 0]
    return jain_of(x) if len(x) >= 2 else None


class Meter:
    """Time integrals of allocation and fairness, and the series the chart draws.

    Integrals are kept twice: [0] over the arrival window (first to last arrival, the
    period the scenario models: afterwards the cluster only drains) and [1] over the whole
    replay. "While there is pending work" means while a pod is pending that a scheduling
    cycle has seen and not placed (a pod that just arrived is not yet waiting).
    """

    def __init__(self, projects: list[str], quota: dict[str, int], weight: dict[str, float], window_end: float,
                 limit: dict[str, int] | None = None):
        self.projects = projects
        self.quota = quota
        self.weight = weight
        self.limit = limit or {}
        self.window_end = window_end
        self.held: dict[str, int] = dict.fromkeys(projects, 0)
        self.held_total = 0
        self.pend_over: dict[str, int] = dict.fromkeys(projects, 0)  # as of the last cycle
        self.pend_all: dict[str, int] = dict.fromkeys(projects, 0)  # likewise, all pending milli
        self.pending_seen = False
        # As of the last cycle: whether the rules let some waiting pod start (record 0051),
        # and while none could, what held them back (shares of the moment, adding up to 1).
        self.could_start = False
        self.held_split: dict[str, float] = {}
        # Quota a project leaves unused while work of its own waits (the guarantee not
        # delivered, milli), summed over projects: now, and its integral over the window.
        self.unserved_now = 0
        self.unserved_int = 0.0
        self.jain_now: float | None = None
        self.t = 0.0
        self.busy_pending = [0.0, 0.0]  # milli-seconds allocated while work was pending
        self.pending_time = [0.0, 0.0]
        self.busy_startable = [0.0, 0.0]  # ... while some waiting pod could start
        self.startable_time = [0.0, 0.0]
        self.held_by: dict[str, float] = {}  # held-back seconds in the window, per cause
        self.delivered = [0.0, 0.0]  # milli-seconds allocated
        self.jain_int = [0.0, 0.0]
        self.jain_time = [0.0, 0.0]
        self.shares: tuple[list[str], list[float], list[float]] | None = None  # over_quota_shares now
        self.over_int: list[dict[str, float]] = [{}, {}]  # per project: over-quota milli x s held
        self.share_int: list[dict[str, float]] = [{}, {}]  # ... and deserved, while it wants them
        self.over_total_int = [0.0, 0.0]  # over-quota milli in use x s, while the index is defined
        self.wanting_int = [0.0, 0.0]  # projects wanting over-quota GPUs x s, likewise
        self.series_t: list[float] = []
        self.series_total: list[int] = []
        self.series_proj: list[tuple[int, ...]] = []

    def advance(self, t: float) -> None:
        if t <= self.t:
            return
        in_window = max(0.0, min(t, self.window_end) - self.t)
        self.unserved_int += self.unserved_now * in_window
        for i, dt in enumerate((in_window, t - self.t)):
            self.delivered[i] += self.held_total * dt
            if self.pending_seen:
                self.busy_pending[i] += self.held_total * dt
                self.pending_time[i] += dt
                if self.could_start:
                    self.busy_startable[i] += self.held_total * dt
                    self.startable_time[i] += dt
                elif i == 0:
                    for cause, share in self.held_split.items():
                        self.held_by[cause] = self.held_by.get(cause, 0.0) + share * dt
            if self.jain_now is not None:
                self.jain_int[i] += self.jain_now * dt
                self.jain_time[i] += dt
            if self.shares is not None and dt > 0:
                over, deserved = self.over_int[i], self.share_int[i]
                self.over_total_int[i] += sum(self.shares[1]) * dt
                self.wanting_int[i] += len(self.shares[0]) * dt
                for p, a, sh in zip(*self.shares):
                    over[p] = over.get(p, 0.0) + a * dt
                    deserved[p] = deserved.get(p, 0.0) + sh * dt
        self.t = t

    def change(self, project: str, milli: int) -> None:
        self.held[project] += milli
        self.held_total += milli

    def record(self) -> None:
        self.unserved_now = sum(
            max(0, min(q - self.held[p], self.pend_all[p])) for p, q in self.quota.items()
        )
        self.shares = st = over_quota_shares(self.held, self.pend_over, self.quota, self.weight, self.limit)
        self.jain_now = None
        if st is not None:
            x = [a / s for a, s in zip(st[1], st[2]) if s > 0]
            self.jain_now = jain_of(x) if len(x) >= 2 else None
        if self.series_t and self.series_t[-1] == self.t:
            self.series_t.pop(), self.series_total.pop(), self.series_proj.pop()
        self.series_t.append(self.t)
        self.series_total.append(self.held_total)
        self.series_proj.append(tuple(self.held[p] for p in self.projects))

    def allocation_pct(self, capacity_milli: int, window: bool, startable: bool = True) -> float | None:
        """Allocation while work waits: with ``startable``, only while the rules let some
        waiting pod start (the goal's reading, record 0051); else while any work waits."""
        i = 0 if window else 1
        busy, time_ = (self.busy_startable, self.startable_time) if startable else (self.busy_pending, self.pending_time)
        if not time_[i]:
            return None
        return round(100 * busy[i] / (capacity_milli * time_[i]), 2)

    def unserved_quota_gpus(self) -> float | None:
        """GPUs of quota left unused while their project had work waiting, summed over the
        projects and averaged over the arrival window."""
        t = min(self.t, self.window_end)
        return round(self.unserved_int / t / MILLI, 2) if t > 0 else None

    def jain_mean(self, window: bool) -> float | None:
        """The instantaneous index, averaged over the time it is defined."""
        i = 0 if window else 1
        return round(self.jain_int[i] / self.jain_time[i], 4) if self.jain_time[i] else None

    def jain_over_time(self, window: bool) -> float | None:
        """Jain's index over the projects of (over-quota GPU-seconds held) / (over-quota
        GPU-seconds deserved by weight), both integrated over the times the project wanted
        over-quota GPUs: whether each team got its weighted share of the over-quota capacity
        over the replay, whichever moments it got it in."""
        i = 0 if window else 1
        x = [self.over_int[i][p] / d for p, d in self.share_int[i].items() if d > 0]
        v = jain_of(x)
        return None if v is None else round(v, 4)

    def over_quota_ratios(self, window: bool) -> dict[str, float]:
        i = 0 if window else 1
        return {p: round(self.over_int[i][p] / d, 3) for p, d in self.share_int[i].items() if d > 0}


@dataclass
class PolicyResult:
    policy: str
    metrics: dict
    series_t: np.ndarray = field(repr=False)
    series_total: np.ndarray = field(repr=False)
    series_proj: np.ndarray = field(repr=False)  # (T, projects) milli
    projects: list[str] = field(default_factory=list)
    quota_milli: dict[str, int] = field(default_factory=dict)


def _pct(xs: list[float], q: float) -> float | None:
    return round(float(np.percentile(xs, q)), 1) if xs else None


# -- the replay -------------------------------------------------------------------------
_FINISH, _RELEASED, _ARRIVE = 0, 1, 2  # at one instant: frees first, then arrivals

# The keys of ``preemptions_by_reason`` and ``thrash_by_reason`` per eviction cause; fair
# share over time (catch up) counts with fair share, as the JSON has always had it.
REASON_KEYS = {
    EvictionCause.RECLAIM: "reclaim",
    EvictionCause.FAIR_SHARE: "fair share",
    EvictionCause.CATCH_UP: "fair share",
    EvictionCause.PREEMPT: "preempt",
    EvictionCause.CONSOLIDATE: "consolidate",
}


def queue_key(w: Workload) -> tuple:
    """The core's queue order (``cycle.queue_order``): priority, resumed first, submit time."""
    return (-w.queue_priority, w.submit_time, w.name)


class _Queues:
    """Per core project and kind: the pending pods the scheduler sees (the first ``depth`` in queue
    order, in the snapshot) and the rest (parked here)."""

    def __init__(self, snap: Snapshot, depth: int):
        self.snap = snap
        self.depth = depth
        self.visible: dict[tuple[str, Kind], list[tuple]] = {}
        self.parked: dict[tuple[str, Kind], list[tuple]] = {}
        self.waiting: dict[str, Workload] = {}
        self.count = 0

    def add(self, w: Workload) -> bool:
        """Queue ``w``; True if the scheduler sees it (the snapshot changed), False if parked."""
        self.count += 1
        key = queue_key(w)
        q = (w.project, w.kind)
        vis = self.visible.setdefault(q, [])
        if len(vis) >= self.depth:
            if key > vis[-1]:
                self.waiting[w.name] = w
                heapq.heappush(self.parked.setdefault(q, []), key)
                return False
            worst = vis.pop()
            self.waiting[worst[2]] = self.snap.workloads[worst[2]]
            self.snap.remove_workload(worst[2])
            heapq.heappush(self.parked.setdefault(q, []), worst)
        bisect.insort(vis, key)
        self.snap.upsert_workload(w)
        return True

    def placed(self, w: Workload) -> None:
        """``w`` (visible) was bound: it leaves the queue."""
        self.count -= 1
        vis = self.visible[(w.project, w.kind)]
        del vis[bisect.bisect_left(vis, queue_key(w))]

    def refill(self) -> bool:
        """Show the scheduler the next parked pods where binds made room; True if any."""
        moved = False
        for q, vis in self.visible.items():
            parked = self.parked.get(q)
            while parked and len(vis) < self.depth:
                key = heapq.heappop(parked)
                vis.append(key)  # every parked key ranks after every visible one
                self.snap.upsert_workload(self.waiting.pop(key[2]))
                moved = True
        return moved


class _Replay:
    def __init__(
        self,
        nodes: list[Node],
        jobs: list[Job],
        scn: Scenario,
        policy: str,
        placement: str,
        check: bool,
        skip_quiet: bool,
        fair_share_over_time: bool = True,
        consolidate_in_quota: bool = True,
    ):
        self.scn = scn
        self.policy = policy
        self.check = check
        self.capacity = sum(len(n.gpus) for n in nodes) * MILLI
        self.quota = scn.quotas_milli(self.capacity)
        setup = SETUPS[policy](scn, self.capacity, placement)
        self.limits = {p.name: round(q.limit * MILLI) for p in setup.projects
                       if (q := p.quotas.get(DEFAULT_POOL)) is not None and q.limit is not None}
        setup.config = dataclasses.replace(setup.config, fair_share_over_time=fair_share_over_time,
                                           consolidate_in_quota=consolidate_in_quota)
        self.to_workload = setup.workload
        self.snap = Snapshot.build(nodes, setup.departments, setup.projects, config=setup.config)
        # Over-quota lag per project (fair share over time), kept only where work may go
        # over quota by fair share: the replay knows what ran, the core reads the snapshot.
        cfg = setup.config
        keep_lag = cfg.fair_share_reclaim and cfg.fair_share_over_time
        self.ledger = OverQuotaLedger(cfg.fair_share_half_life_s) if keep_lag else None
        depth = scn.time.queue_depth * max(1, len(scn.teams) // len(setup.projects))
        self.queues = _Queues(self.snap, depth)
        self.jobs = {j.name: j for j in jobs}
        window_end = max((j.submit for j in jobs), default=0.0)
        self.meter = Meter([t.name for t in scn.teams], self.quota, scn.weights(), window_end, self.limits)
        self.pend_all: dict[str, int] = dict.fromkeys(self.quota, 0)  # pending milli
        self.pend_over: dict[str, int] = dict.fromkeys(self.quota, 0)  # of it, may go over quota
        # The sizes of that work per project (milli -> pods), for the part its limit lets start.
        self.pend_sizes: dict[str, dict[int, int]] = {p: {} for p in self.quota}
        self.period = scn.time.scheduling_period_s
        # The last decided cycle's fair share per project (milli), which the rules read for
        # work over its quota; a quiet cycle skipped would have decided the same.
        self.fair: dict[str, int] = {}
        self.ckpt = scn.time.checkpoint_interval_s
        self.events: list[tuple[float, int, int, str, int]] = []
        self.seq = 0
        self.dirty_since: float | None = None
        self.cycles = 0
        self.decide_s = 0.0
        self.preemptions = 0
        self.by_reason: dict[str, int] = {}
        self.thrash = 0
        self.thrash_by_reason: dict[str, int] = {}
        self.lost_gpu_s = 0.0
        self.moves = 0
        self.moves_lost_gpu_s = 0.0
        # Skipping quiet cycles: a cycle whose input is the last cycle's, when that one
        # decided nothing, would decide nothing again (``decide`` is a function of the
        # snapshot, and reads the clock only for the resume protection). ``version`` counts
        # the replay's changes to the snapshot; ``quiet`` is (version, time) of the last
        # cycle if it decided nothing; ``expiries`` the times protections end.
        self.skip_quiet = skip_quiet
        self.version = 0
        self.quiet: tuple[int, float, dict[tuple[str, str], float]] | None = None
        self.expiries: list[float] = []
        self.skipped = 0
        for j in jobs:
            self._push(j.submit, _ARRIVE, j.name, 0)

    def _push(self, t: float, kind: int, name: str, gen: int) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, kind, self.seq, name, gen))

    def _changed(self, t: float) -> None:
        if self.dirty_since is None:
            self.dirty_since = t

    def run(self) -> PolicyResult:
        wall0, cpu0 = time.perf_counter(), time.process_time()
        events, meter = self.events, self.meter
        while True:
            if self.dirty_since is not None:
                if not self.snap.pending:
                    self.dirty_since = None
                else:
                    tick = math.ceil(self.dirty_since / self.period - 1e-9) * self.period
                    if not events or events[0][0] > tick:
                        meter.advance(tick)
                        self._cycle(tick)
                        continue
            if not events:
                break
            t, kind, _, name, gen = heapq.heappop(events)
            meter.advance(t)
            job = self.jobs[name]
            if kind == _ARRIVE:
                self._arrive(job, t)
            elif kind == _FINISH:
                if gen == job.gen:
                    self._finish(job, t)
            else:
                self._released(job, t)
            meter.record()
        return self._result(time.perf_counter() - wall0, time.process_time() - cpu0)

    # -- events ----------------------------------------------------------------------
    def _pending(self, job: Job, sign: int) -> None:
        self.pend_all[job.project] += sign * job.milli
        if job.over_ok:
            self.pend_over[job.project] += sign * job.milli
            sizes = self.pend_sizes[job.project]
            sizes[job.milli] = sizes.get(job.milli, 0) + sign

    def _arrive(self, job: Job, t: float) -> None:
        p = job.project
        job.in_quota = self.meter.held[p] + self.pend_all[p] + job.milli <= self.quota[p]
        self._pending(job, +1)
        if self.queues.add(self.to_workload(job)):
            self.version += 1
        self._changed(t)

    def _finish(self, job: Job, t: float) -> None:
        job.finish = t
        job.remaining = 0.0
        self.snap.remove_workload(job.name)
        self.version += 1
        self.meter.change(job.project, -job.milli)
        self._changed(t)

    def _released(self, job: Job, t: float) -> None:
        w = self.snap.workloads[job.name]
        self.snap.remove_workload(job.name)
        self.version += 1
        self.meter.change(job.project, -job.milli)
        self._pending(job, +1)
        self.queues.add(dataclasses.replace(w, state=State.PENDING, placement=(), over_quota=False, resumed=True))
        self._changed(t)

    # -- a scheduling cycle ----------------------------------------------------------
    def _cycle(self, t: float) -> None:
        self.dirty_since = None
        snap = self.snap
        snap.now = t  # resume protection: the core compares it with each started_at
        if self.ledger is not None:
            snap.over_quota_lag = self.ledger.lag_at(t)
        self.cycles += 1
        if self._quiet_since_last(t):
            self.skipped += 1
            self._after_cycle(t)
            return
        t0 = time.perf_counter()
        d = decide(snap)
        self.decide_s += time.perf_counter() - t0
        self.fair = {p: m for (p, pool), m in d.fair_share_milli.items() if pool == DEFAULT_POOL}
        self.quiet = None if d.binds or d.evictions else (self.version, t, snap.over_quota_lag)
        for b in d.binds:
            job = self.jobs[b.workload]
            w = snap.workloads[b.workload]
            self.queues.placed(w)
            snap.upsert_workload(
                dataclasses.replace(w, state=State.RUNNING, placement=b.pods, over_quota=b.over_quota, started_at=t)
            )
            job.start = t
            if job.first_start is None:
                job.first_start = t
            if w.resumed:
                heapq.heappush(self.expiries, t + snap.config.resume_protection_s)
            self._push(t + job.remaining, _FINISH, job.name, job.gen)
            self.meter.change(job.project, job.milli)
            self._pending(job, -1)
        for e in d.evictions:
            self._evict(self.jobs[e.workload], t, e)
        self.version += len(d.binds) + len(d.evictions)
        self._after_cycle(t)

    def _quiet_since_last(self, t: float) -> bool:
        """Would ``decide`` now see what the last cycle saw, which decided nothing? Same
        snapshot (no change since), and no resume protection ended in between (the only
        thing the clock changes: a workload protected then, s + P > t0, is not now, s + P <= t)."""
        if not self.skip_quiet or self.quiet is None or self.quiet[0] != self.version:
            return False
        if self.quiet[2] != self.snap.over_quota_lag:  # the lags moved: decisions may too
            return False
        ends, t0 = self.expiries, self.quiet[1]
        while ends and ends[0] <= t0:
            heapq.heappop(ends)
        return not (ends and ends[0] <= t)

    def _after_cycle(self, t: float) -> None:
        if self.queues.refill():
            self.version += 1
            self._changed(t)  # the next pods of a queue get a cycle at once
        # Jain counts only the waiting work the quota rules let start (``_quota_lets``): a pod
        # its project's limit refuses is not wanted over-quota capacity.
        self.meter.pend_over = {p: self.pend_over[p] if (lim := self.limits.get(p)) is None else
                                sum(m * n for m, n in self.pend_sizes[p].items() if self.meter.held[p] + m <= lim)
                                for p in self.pend_over}
        self.meter.pend_all = dict(self.pend_all)
        if self.ledger is not None:
            self.ledger.observe(
                self.snap.projects, self.snap.usage, {(p, DEFAULT_POOL): m for p, m in self.pend_over.items()}
            )
        self.meter.pending_seen = self.queues.count > 0
        self._read_waiting()
        self.meter.record()
        if self.check:
            check_conservation(self.snap)

    def _quota_lets(self, w: Workload) -> bool:
        """Do the quota rules alone let ``w`` start: inside its project's quota, or (gpupool)
        over it for work that may go over quota, within the project's limit?"""
        if self.policy == "fifo-shared":
            return True
        after = self.meter.held[w.project] + self.jobs[w.name].milli
        if after <= self.quota[w.project]:
            return True
        limit = self.limits.get(w.project)
        return self.policy == "gpupool" and w.may_go_over_quota and (limit is None or after <= limit)

    def _read_waiting(self) -> None:
        """Whether the rules let some pod the cycle saw waiting start, and if none could,
        what held each back (``startable``). Under static and fifo-shared nothing is taken
        for a waiting pod, so it could start only in free room. A pod the quota rules hold
        (its project at its quota or limit) is held back by its own project."""
        m = self.meter
        m.could_start, m.held_split = False, {}
        waiting = list(self.snap.pending.values())
        if not m.pending_seen or not waiting:
            return
        h = Holdings(self.snap, m.held, self.quota, self.fair)
        if self.policy != "gpupool":
            m.could_start = any(self._quota_lets(w) and h.fits_free(w) for w in waiting)
            return
        if any(self._quota_lets(w) and h.could_start(w, self.jobs[w.name].milli) for w in waiting):
            m.could_start = True
            return
        for w in waiting:
            causes = h.hold_causes(w, self.jobs[w.name].milli) if self._quota_lets(w) else {"own quota or limit"}
            for c in causes:
                m.held_split[c] = m.held_split.get(c, 0.0) + 1 / (len(waiting) * len(causes))

    def _evict(self, job: Job, t: float, e: Evict) -> None:
        w = self.snap.workloads[job.name]
        self.snap.upsert_workload(dataclasses.replace(w, state=State.RELEASING))
        assert job.start is not None  # it runs
        ran = t - job.start
        saved = math.floor(ran / self.ckpt) * self.ckpt
        job.remaining -= saved
        self.lost_gpu_s += (ran - saved) * job.milli / MILLI
        why = REASON_KEYS[e.cause]
        if job.preemptions and ran < self.scn.time.thrash_window_s:
            self.thrash += 1
            self.thrash_by_reason[why] = self.thrash_by_reason.get(why, 0) + 1
        job.preemptions += 1
        job.gen += 1
        if e.cause == EvictionCause.CONSOLIDATE:  # a move, counted apart (record 0050)
            self.moves += 1
            self.moves_lost_gpu_s += (ran - saved) * job.milli / MILLI
        else:
            self.preemptions += 1
            self.by_reason[why] = self.by_reason.get(why, 0) + 1
        self._push(t + e.grace_period_s, _RELEASED, job.name, job.gen)

    # -- results ---------------------------------------------------------------------
    def _result(self, wall: float, cpu: float) -> PolicyResult:
        m, end = self.meter, self.meter.t
        jobs = list(self.jobs.values())
        waits = [(j.first_start if j.first_start is not None else end) - j.submit for j in jobs]
        in_quota = [w for w, j in zip(waits, jobs) if j.in_quota]
        finished = [(j.finish, j.submit) for j in jobs if j.finish is not None]
        metrics = {
            "policy": self.policy,
            "gpu_allocation_mean_pct": m.allocation_pct(self.capacity, window=True),
            # The reading before record 0051: while any work waits, startable or not.
            "gpu_allocation_mean_pct_any_wait": m.allocation_pct(self.capacity, window=True, startable=False),
            "startable_time_in_window_s": round(m.startable_time[0], 1),
            # Of the time work waited, the share in which every waiting pod was held back by
            # protected work, and that time split by what protected it (``startable.CAUSES``).
            "held_back_share_pct": round(100 * (1 - m.startable_time[0] / m.pending_time[0]), 1) if m.pending_time[0] else None,
            "held_back_by_s": {c: round(v, 1) for c, v in sorted(m.held_by.items())},
            "in_quota_wait_p50_s": _pct(in_quota, 50),
            "in_quota_wait_p99_s": _pct(in_quota, 99),
            "all_wait_p50_s": _pct(waits, 50),
            "all_wait_p99_s": _pct(waits, 99),
            "jct_mean_s": round(sum(f - s for f, s in finished) / len(finished), 1) if finished else None,
            "preemptions": self.preemptions,
            "moves": self.moves,
            "lost_gpu_hours": round(self.lost_gpu_s / 3600, 2),
            "lost_gpu_hours_in_moves": round(self.moves_lost_gpu_s / 3600, 2),
            "gpu_hours_delivered": round(m.delivered[1] / MILLI / 3600, 1),
            # Work lost to evictions and moves, against the GPU-hours delivered (record 0050).
            "lost_gpu_hours_share_pct": round(100 * self.lost_gpu_s * MILLI / m.delivered[1], 3) if m.delivered[1] else None,
            "thrash_count": self.thrash,
            # The guarantee beyond the in-quota waits: quota idle while its team waited.
            "quota_unserved_mean_gpus": m.unserved_quota_gpus(),
            "fairness_jain": m.jain_over_time(window=True),
            "fairness_jain_instant_mean": m.jain_mean(window=True),
            "fairness_time_s": round(m.jain_time[0], 1),
            "over_quota_in_use_mean_gpus": round(m.over_total_int[0] / m.jain_time[0] / MILLI, 2) if m.jain_time[0] else None,
            "projects_wanting_over_quota_mean": round(m.wanting_int[0] / m.jain_time[0], 2) if m.jain_time[0] else None,
            "over_quota_received_vs_deserved": m.over_quota_ratios(window=True),
            "preemptions_by_reason": dict(sorted(self.by_reason.items())),
            "thrash_by_reason": dict(sorted(self.thrash_by_reason.items())),
            "pods": len(jobs),
            "in_quota_pods": len(in_quota),
            "finished_pods": len(finished),
            "pending_at_end": self.queues.count,
            "never_started": sum(1 for j in jobs if j.first_start is None),
            "arrival_window_s": round(m.window_end, 1),
            "pending_time_in_window_s": round(m.pending_time[0], 1),
            "gpu_allocation_mean_pct_whole_replay": m.allocation_pct(self.capacity, window=False),
            "gpu_allocation_mean_pct_any_wait_whole_replay": m.allocation_pct(self.capacity, window=False, startable=False),
            "fairness_jain_whole_replay": m.jain_over_time(window=False),
            "fairness_jain_instant_mean_whole_replay": m.jain_mean(window=False),
            "pending_time_s": round(m.pending_time[1], 1),
            "end_s": round(end, 1),
            "cycles": self.cycles,
            "cycles_skipped_quiet": self.skipped,
            "decide_s": round(self.decide_s, 2),
            "wall_s": round(wall, 2),
            "cpu_s": round(cpu, 2),
        }
        return PolicyResult(
            self.policy,
            metrics,
            np.array(m.series_t),
            np.array(m.series_total),
            np.array(m.series_proj, dtype=np.int64).reshape(len(m.series_t), len(m.projects)),
            list(m.projects),
            dict(self.quota),
        )


def check_conservation(snap: Snapshot) -> None:
    """No GPU, CPU or memory over-committed: the holders' placements, added up per node
    and GPU, within what each node has. Raises ``AssertionError``."""
    used: dict[tuple[str, int], int] = {}
    cpu: dict[str, int] = {}
    for ws in snap.holding.values():
        for w in ws.values():
            assert w.state in (State.RUNNING, State.RELEASING), w.name
            for p in w.placement:
                for g in p.gpu_indices:
                    used[(p.node, g)] = used.get((p.node, g), 0) + p.gpu_milli
                cpu[p.node] = cpu.get(p.node, 0) + w.demand.cpu_milli
    for (node, g), milli in used.items():
        assert g < len(snap.nodes[node].gpus), f"{node} has no GPU {g}"
        assert milli <= MILLI, f"GPU {g} of {node} over-committed: {milli} milli"
    for node, c in cpu.items():
        assert c <= snap.nodes[node].cpu_milli, f"{node} CPU over-committed: {c}"


def replay(
    nodes: list[Node],
    pods: list[TracePod],
    scn: Scenario,
    policy: str,
    placement: str | None = None,
    check: bool = False,
    skip_quiet: bool = True,
    fair_share_over_time: bool = True,
    consolidate_in_quota: bool = True,
) -> PolicyResult:
    """Replay the scenario's pods under one policy. ``skip_quiet=False`` calls ``decide``
    even in cycles that provably decide nothing (same results, slower: for checking);
    ``fair_share_over_time`` and ``consolidate_in_quota`` set SchedulerConfig's switches."""
    if policy not in SETUPS:
        raise ValueError(f"unknown policy {policy!r}; choose from {', '.join(SETUPS)}")
    jobs = make_jobs(pods, scn, nodes)
    return _Replay(nodes, jobs, scn, policy, placement or scn.placement, check, skip_quiet, fair_share_over_time,
                   consolidate_in_quota).run()


def offered_load(nodes: list[Node], pods: list[TracePod], scn: Scenario) -> dict:
    """What the pods ask of the cluster while they arrive: the GPUs they would hold on a
    cluster without limit, each started on arrival, averaged over the arrival window and
    divided by the capacity (the service left after the window is not counted)."""
    jobs = make_jobs(pods, scn, nodes)
    cap = sum(len(n.gpus) for n in nodes)
    end = jobs[-1].submit if jobs else 0.0
    gpu_s = sum(j.milli / MILLI * max(0.0, min(j.submit + j.service, end) - j.submit) for j in jobs)
    return {
        "pods": len(jobs),
        "nodes": len(nodes),
        "capacity_gpus": cap,
        "arrival_window_s": round(end, 1),
        "requested_gpus": round(sum(j.milli for j in jobs) / MILLI, 1),
        "offered_load_pct": round(100 * gpu_s / (cap * end), 1) if end else None,
    }


# The goals on every scenario, among the keys of ``goals`` (the others are the figures beside
# them); on the idle-silo class (``static_class``) also ``IDLE_SILO_GOAL_KEYS``.
GOAL_KEYS = (
    "allocation_ge_85_pct",
    "quota_unserved_le_static",
    "in_quota_p99_within_static_plus_period_and_grace",
    "thrash_zero",
    "jain_ge_0_9",
    "lost_work_le_1_pct",
)
IDLE_SILO_GOAL_KEYS = ("allocation_ge_2x_static",)
# The class a scenario is of, from static's allocation while work waits (record 0053):
# idle silos at most 40%, contended at least 80%, mixed between (and where nothing waited).
IDLE_SILO_STATIC_MAX_PCT = 40
CONTENDED_STATIC_MIN_PCT = 80
LOST_WORK_MAX_PCT = 1.0  # lost GPU-hours, as a share of those delivered (record 0050)


def static_class(static_alloc_pct: float | None) -> str:
    """``idle-silo``, ``contended`` or ``mixed``, from static's allocation while work waits."""
    if static_alloc_pct is not None and static_alloc_pct <= IDLE_SILO_STATIC_MAX_PCT:
        return "idle-silo"
    if static_alloc_pct is not None and static_alloc_pct >= CONTENDED_STATIC_MIN_PCT:
        return "contended"
    return "mixed"


def goals(results: dict[str, dict], scn: Scenario) -> dict:
    """The goals (``GOAL_KEYS``, and on the idle-silo class ``IDLE_SILO_GOAL_KEYS``), each
    with its figures, for gpupool against static. A goal whose figure is undefined is None,
    not a miss: allocation is counted only while work waits and the rules let some of it
    start, so where that never happened under a policy it has none (a light load, say), and
    Jain's index has none where no two projects holding their quota ever wanted over-quota
    GPUs at once. ``goal_keys`` lists the goals that apply, ``goals_missed`` and
    ``goals_undefined`` those that are False and None.

    The ratio to static divides gpupool's figure by static's allocation while any of its work
    waits: static's rules leave no startable pod waiting past a cycle, so that is the only
    reading static has. The class, and with it whether 2x static is a goal, is read from
    static's figure (record 0053)."""
    g, s = results.get("gpupool"), results.get("static")
    if not g or not s:
        return {}
    bound = (s["in_quota_wait_p99_s"] or 0) + scn.time.scheduling_period_s + scn.time.eviction_grace_s
    alloc, jain_ = g["gpu_allocation_mean_pct"], g["fairness_jain"]
    static = s.get("gpu_allocation_mean_pct_any_wait", s["gpu_allocation_mean_pct"])
    both = alloc is not None and static is not None
    unserved, unserved_static = g.get("quota_unserved_mean_gpus"), s.get("quota_unserved_mean_gpus")
    lost = g.get("lost_gpu_hours_share_pct")
    cls = static_class(static)
    out = {
        "allocation_ge_85_pct": None if alloc is None else alloc >= 85,
        "allocation_ge_2x_static": alloc >= 2 * static if both else None,
        "allocation_x_static": round(alloc / static, 2) if both and static else None,
        # Allocation cannot pass 100%: where static is above 50% no policy can double it.
        "allocation_x_static_ceiling": round(100 / static, 2) if static else None,
        "allocation_2x_static_attainable": None if static is None else 2 * static <= 100,
        "work_waited": {"gpupool": g.get("gpu_allocation_mean_pct_any_wait", alloc) is not None,
                        "static": static is not None},
        "quota_unserved_le_static": (
            None if unserved is None or unserved_static is None else unserved <= unserved_static
        ),
        "quota_unserved_gpus": {"gpupool": unserved, "static": unserved_static},
        "in_quota_p99_within_static_plus_period_and_grace": (g["in_quota_wait_p99_s"] or 0) <= bound,
        "in_quota_p99_bound_s": bound,
        "thrash_zero": g["thrash_count"] == 0,
        "jain_ge_0_9": None if jain_ is None else jain_ >= 0.9,
        "lost_work_le_1_pct": None if lost is None else lost <= LOST_WORK_MAX_PCT,
        "static_class": cls,
        "idle_silos": cls == "idle-silo",
    }
    keys = GOAL_KEYS + (IDLE_SILO_GOAL_KEYS if cls == "idle-silo" else ())
    out["goal_keys"] = list(keys)
    out["goals_missed"] = [k for k in keys if out[k] is False]
    out["goals_undefined"] = [k for k in keys if out[k] is None]
    return out


def replay_all(
    nodes: list[Node],
    pods: list[TracePod],
    scn: Scenario,
    policies: tuple[str, ...] = POLICY_NAMES,
    placement: str | None = None,
    check: bool = False,
    skip_quiet: bool = True,
    fair_share_over_time: bool = True,
    consolidate_in_quota: bool = True,
) -> tuple[dict, list[PolicyResult]]:
    """Every policy on the same pods; the JSON document and the per-policy results.
    ``placement``: None for the scenario's."""
    placement = placement or scn.placement
    results = [replay(nodes, pods, scn, p, placement, check, skip_quiet, fair_share_over_time, consolidate_in_quota)
               for p in policies]
    by = {r.policy: r.metrics for r in results}
    doc = {
        "scenario": scn.to_json(),
        "placement": placement,
        "fair_share_over_time": fair_share_over_time,
        "consolidate_in_quota": consolidate_in_quota,
        "load": offered_load(nodes, pods, scn),
        "policies": by,
        "goals": goals(by, scn),
        "wall_s": round(sum(r.metrics["wall_s"] for r in results), 2),
        "cpu_s": round(sum(r.metrics["cpu_s"] for r in results), 2),
    }
    return doc, results
