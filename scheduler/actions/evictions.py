"""The ways of making room for waiting work, one object each, in one ordered registry
(``EVICTIONS``). The make-room action (``make_room``) asks, for each waiting workload and
pool, which of them apply, and plans evictions with each in turn until one makes room.

Each says: when it applies, which projects it takes from (in eviction order) and the
floor each must keep, whether the waiting workload may take the room it makes, and the
reason its victims read (with its ``EvictionCause``).
"""

from __future__ import annotations

from collections.abc import Iterator

from ..cycle import Cycle
from ..model import NO_QUOTA, EvictionCause, Workload
from ..quota import may_catch_up
from ..snapshot import SchedulerConfig


class Eviction:
    cause: EvictionCause
    name: str  # the key of its time in the cycle's timings (``make_room.<name>_s``)
    # The waiting workload's reason while its victims exit: "<verb> N workloads of ...".
    verb = "reclaiming GPUs from"
    # Takes from the waiting workload's own project: that frees room in its own quota (the
    # verdict is asked again as if the victims were gone), and a plan that found nothing
    # to take says nothing about another project's work of the same shape.
    own_project = False
    # Where taking victims in the global eviction order cannot make room, look at each
    # node on its own (``MakeRoom.node_plan``).
    per_node_plan = True

    def enabled(self, cfg: SchedulerConfig) -> bool:
        raise NotImplementedError

    def applies(self, c: Cycle, w: Workload, pool: str, v) -> bool:
        """May it make room for ``w`` in ``pool``, whose quota verdict is ``v``?"""
        raise NotImplementedError

    def admits(self, c: Cycle, w: Workload, pool: str) -> bool:
        """May ``w`` take the room it made, as things are now?"""
        return c.verdict(w, pool).allowed

    def group(self, c: Cycle, w: Workload, pool: str) -> object:
        """What its candidates depend on besides ``w``'s project and pool."""
        return None

    def projects(self, c: Cycle, w: Workload, pool: str) -> Iterator[str]:
        """The projects it takes from, in eviction order."""
        raise NotImplementedError

    def floor(self, c: Cycle, project: str, pool: str) -> int | None:
        """The milli-GPUs a victim's project keeps in ``pool``; None: no floor."""
        return None

    def stops_at(self, priority: int, w: Workload) -> bool:
        """Are victims from this priority on (in eviction order) out of reach for ``w``?"""
        return False

    def reason(self, v: Workload, w: Workload) -> str:
        raise NotImplementedError


def _others_furthest_above_fair_share(c: Cycle, w: Workload, pool: str) -> list[str]:
    snap = c.snap
    others = [p for p in snap.projects if p != w.project and snap.victims.get(p)]
    return sorted(others, key=lambda p: (c.fair.get((p, pool), 0) - c.work.usage[(p, pool)], p))


class QuotaReclaim(Eviction):
    """For a project below its quota: other projects' over-quota work, the project furthest
    above its fair share first; a victim leaves its project at or above its quota."""

    cause, name = EvictionCause.RECLAIM, "quota_reclaim"

    def enabled(self, cfg: SchedulerConfig) -> bool:
        return cfg.reclaim

    def applies(self, c: Cycle, w: Workload, pool: str, v) -> bool:
        # Only while the project's whole usage leaves room in its quota: where its own
        # preemptible work holds the quota, that gives way first (preemption), not another
        # team's borrowed GPUs.
        return v.allowed and not v.over_quota and not v.guaranteed_only

    def projects(self, c: Cycle, w: Workload, pool: str) -> Iterator[str]:
        return iter(_others_furthest_above_fair_share(c, w, pool))

    def floor(self, c: Cycle, project: str, pool: str) -> int | None:
        return c.snap.projects[project].quotas.get(pool, NO_QUOTA).quota_milli

    def reason(self, v: Workload, w: Workload) -> str:
        return f"reclaimed: project {w.project} is below its quota and needs the GPUs for {w.name}"


class FairShareReclaim(Eviction):
    """For over-quota work of a project below its fair share of the idle GPUs: other
    projects' work above their fair share, furthest above first; a victim leaves its
    project at or above its fair share, and the waiting workload stays within its own."""

    cause, name = EvictionCause.FAIR_SHARE, "fair_share_reclaim"

    def enabled(self, cfg: SchedulerConfig) -> bool:
        return cfg.fair_share_reclaim

    def applies(self, c: Cycle, w: Workload, pool: str, v) -> bool:
        return v.allowed and v.over_quota and c.fits_fair_share(w, pool)

    def admits(self, c: Cycle, w: Workload, pool: str) -> bool:
        return c.verdict(w, pool).allowed and c.fits_fair_share(w, pool)

    def projects(self, c: Cycle, w: Workload, pool: str) -> Iterator[str]:
        for p in _others_furthest_above_fair_share(c, w, pool):
            if c.work.usage[(p, pool)] > c.fair.get((p, pool), 0):  # at or below it: nothing to take
                yield p

    def floor(self, c: Cycle, project: str, pool: str) -> int | None:
        return c.fair.get((project, pool), 0)

    def reason(self, v: Workload, w: Workload) -> str:
        return f"reclaimed for fair share: project {w.project} is below its fair share and needs the GPUs for {w.name}"


class CatchUp(Eviction):
    """For over-quota work of a project past its fair share of the instant but behind its
    share over time (``quota.may_catch_up``): the over-quota work of projects ahead of
    theirs, furthest ahead first; a victim leaves its project at or above its quota."""

    cause, name = EvictionCause.CATCH_UP, "catch_up"

    def enabled(self, cfg: SchedulerConfig) -> bool:
        return cfg.fair_share_reclaim

    def applies(self, c: Cycle, w: Workload, pool: str, v) -> bool:
        # Where fair-share reclaim applies, it goes instead.
        return v.allowed and v.over_quota and not c.fits_fair_share(w, pool) and bool(catch_up_from(c, w, pool))

    def group(self, c: Cycle, w: Workload, pool: str) -> object:
        return c.milli(w, pool)  # may_catch_up weighs the GPUs asked for

    def projects(self, c: Cycle, w: Workload, pool: str) -> Iterator[str]:
        return iter(catch_up_from(c, w, pool))

    def floor(self, c: Cycle, project: str, pool: str) -> int | None:
        return c.snap.projects[project].quotas.get(pool, NO_QUOTA).quota_milli

    def reason(self, v: Workload, w: Workload) -> str:
        return (
            f"reclaimed for fair share over time: project {w.project} got less than its share of "
            f"over-quota GPUs lately and needs the GPUs for {w.name}"
        )


class Preempt(Eviction):
    """Lower-priority work of the waiting workload's own project, lowest priority first."""

    cause, name = EvictionCause.PREEMPT, "preempt"
    verb = "preempting"
    own_project = True
    per_node_plan = False  # inside a project the global eviction order is kept

    def enabled(self, cfg: SchedulerConfig) -> bool:
        return cfg.preempt

    def applies(self, c: Cycle, w: Workload, pool: str, v) -> bool:
        return True

    def group(self, c: Cycle, w: Workload, pool: str) -> object:
        return w.effective_priority

    def projects(self, c: Cycle, w: Workload, pool: str) -> Iterator[str]:
        return iter((w.project,))

    def stops_at(self, priority: int, w: Workload) -> bool:
        return priority >= w.effective_priority

    def reason(self, v: Workload, w: Workload) -> str:
        return f"preempted by higher-priority workload {w.name} of project {w.project}"


def catch_up_from(c: Cycle, w: Workload, pool: str) -> list[str]:
    """The projects ``w``'s project may reclaim from by fair share over time, furthest
    ahead of its share first (quota.may_catch_up)."""
    if not c.snap.over_quota_lag:  # no lag anywhere: nobody is behind (asked per plan)
        return []
    mine, milli, snap = c.lag(w.project, pool), c.milli(w, pool), c.snap
    held, fair = c.work.usage[(w.project, pool)], c.fair.get((w.project, pool), 0)
    lag = {p: c.lag(p, pool) for p in snap.projects if p != w.project and snap.victims.get(p)}
    ok = [p for p, x in lag.items() if may_catch_up(mine, x, milli, c.cfg.catch_up_s, held, fair)]
    return sorted(ok, key=lambda p: (-lag[p], p))


# In the order of what the waiting workload is owed: its quota first (a guarantee), then
# its fair share of the idle GPUs now, then over time (catch up, only where it is past its
# share now); these three take back GPUs other projects borrowed. Preemption comes last:
# it is the one way that costs the waiting workload's own team, what is left when no other
# team holds borrowed GPUs it may lose.
EVICTIONS: tuple[Eviction, ...] = (QuotaReclaim(), FairShareReclaim(), CatchUp(), Preempt())
