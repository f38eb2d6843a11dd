"""The Kubernetes adapter: watch, keep the snapshot current, decide, apply.

One ``GpupoolScheduler`` runs while it holds the Lease. It is three parts, as Kueue keeps
its cache apart from its scheduler:
  1. sync      ``Watcher.sync`` (watcher.py): list nodes, claims, volumes, StorageClasses,
               Departments, Projects, gpupool's pods and the others; build the snapshot
  2. watch     ``Watcher.watches``: one task per resource applies each event to the
               snapshot; an event that changes what the core sees marks the scheduler dirty
  3. cycle     here: when dirty, ``decide(snapshot)`` (pure), then
  4. apply     here, binds: record the placement in the watcher at once ("assume", as
               kube-scheduler does, so the next cycle never reuses the share), then hand the
               writes to the ``Binder`` (binder.py): bindings, evictions, pending reasons.
Only step 4 writes to the API server, and only the binder does.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from dataclasses import replace

from ..core import decide
from ..metrics import prometheus
from ..model import Decisions, State
from ..quota import OverQuotaLedger, waiting_over_quota
from ..snapshot import SchedulerConfig, Snapshot
from .binder import Binder
from .client import KubeClient
from .config import AdapterConfig
from .watcher import Watcher

__all__ = ["GpupoolScheduler"]

log = logging.getLogger("gpupool.k8s")


class GpupoolScheduler:
    def __init__(self, kc: KubeClient, cfg: AdapterConfig | None = None):
        self.kc = kc
        self.cfg = cfg or AdapterConfig()
        self.snap = Snapshot(self.cfg.core or SchedulerConfig())
        self.last: Decisions | None = None
        self.dirty = asyncio.Event()
        self.synced = asyncio.Event()
        self.stats: defaultdict[str, int] = defaultdict(int)
        # Over-quota lag per (project, pool) for fair share over time. The binder records it
        # in each Project's status; a scheduler that starts (a restart, a new leader) goes on
        # from there.
        self.ledger = OverQuotaLedger(self.snap.config.fair_share_half_life_s)
        self.cache = Watcher(kc, self.cfg, self.snap, self.dirty)
        self.binder = Binder(kc, self.cfg, self.cache, self.stats)
        self.cache.writer = self.binder

    async def run(self, stop: asyncio.Event | None = None) -> None:
        stop = stop or asyncio.Event()
        rvs = await self.cache.sync()
        if self.cache.recorded_lag is not None:
            lag, at = self.cache.recorded_lag
            self.ledger.restore(lag, at, time.time())
            log.info("over-quota lag of %d project pools taken from the Projects' status", len(lag))
        self.synced.set()
        watchers = [asyncio.create_task(w) for w in self.cache.watches(rvs)]
        watchers.append(asyncio.create_task(self.binder.project_status_loop(lambda: self.last,
                                                                            self.ledger)))
        if self.cfg.gpu_reservations:
            watchers.append(asyncio.create_task(self.binder.reservation_loop()))
        cycle = asyncio.create_task(self._cycle_loop())
        self.dirty.set()
        done, _ = await asyncio.wait([cycle, asyncio.create_task(stop.wait()), *watchers],
                                     return_when=asyncio.FIRST_COMPLETED)
        for t in [cycle, *watchers, *self.binder.tasks]:
            t.cancel()
        for t in done:
            if not t.cancelled() and (err := t.exception()):
                raise err

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
                prometheus.observe_cycle(self.snap, decisions, time.perf_counter() - t0)
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
    def _apply(self, d: Decisions) -> None:
        cache = self.cache
        for b in d.binds:
            w = self.snap.workloads.get(b.workload)
            if w is None or w.state != State.PENDING:
                continue
            pods = [cache.pods[k] for k in sorted(cache.members.get(b.workload, ()))]
            pods = [p for p in pods if not p.done and not p.deleting and cache.placement(p) is None]
            if len(pods) < len(b.pods):
                continue
            pairs = list(zip(pods, b.pods))
            started = time.time()
            cache.assume(pairs, b.over_quota, started)
            self.snap.upsert_workload(replace(w, pods=len(b.pods), state=State.RUNNING,
                                              placement=tuple(b.pods), over_quota=b.over_quota,
                                              started_at=started))
            self.binder.forget(b.workload)
            self.binder.bind(b.workload, pairs, b.over_quota)
        for e in d.evictions:
            cache.evicting.add(e.workload)
            cache.refresh(e.workload)  # now RELEASING in the snapshot
            for key in sorted(cache.members.get(e.workload, ())):
                self.binder.evict(cache.pods[key], e.reason, e.grace_period_s)
        now = time.monotonic()
        for p in d.pending:
            self.binder.report_workload(p.workload, "Unschedulable", p.reason, now=now)
