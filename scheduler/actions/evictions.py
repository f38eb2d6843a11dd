"""The ways of making room for waiting work, one object each, in one ordered registry
(``EVICTIONS``). The make-room action (``make_room``) asks, for each waiting workload and
pool, which of them apply, and plans evictions with each in turn until one makes room.

Each says: when it applies, which projects it takes from (in eviction order), the floor
each must keep (``Floor``; how far below it reclaim may go is ``may_take``, the reclaim
rule), whether the waiting workload may take the room it makes, and the reason its victims
read (with its ``EvictionCause``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

from ..cycle import Cycle
from ..guarantee import outranks
from ..model import NO_QUOTA, EvictionCause, Workload
from ..quota import may_catch_up
from ..snapshot import SchedulerConfig
from ..working import Working


class VictimSource(Protocol):
    """What a way of making room reads of the cycle's victims (``victims.Victims``, which
    in turn asks each way for its candidates: declared here, so neither module imports the
    other's)."""

    work: Working

    def pool_victims(self, project: str, pool: str) -> Iterator[tuple[int, Workload, bool]]: ...

    def below_quota_order(self, project: str, pool: str, quota: int) -> list[Workload]: ...


class Floor(int):
    """What a victim's project keeps under one eviction strategy, in milli-GPUs: its quota
    (quota reclaim, catch up) or its fair share (fair-share reclaim). ``below`` marks the
    floor of quota reclaim's second pass, which ``may_take`` lets a project go below."""

    below: bool

    def __new__(cls, milli: int, below: bool = False) -> Floor:
        f = super().__new__(cls, milli)
        f.below = below
        return f


def may_take(floor: Floor | None, left: int, smallest: int) -> bool:
    """The reclaim rule, in one place: may a victim's project be left with ``left``
    milli-GPUs once the work taken from it by one plan (the smallest piece ``smallest``
    milli) is gone?

    At or above its floor, always. Below it only with a ``below`` floor (a project under
    its quota that reclaim without going below found no room for), and only when every
    piece taken would be over quota if it came back (``left + smallest > floor``): it
    cannot reclaim its way back in, so nothing thrashes, and a project that borrowed a gang
    or a multi-GPU pod cannot keep it against a team below its quota just because the
    piece is indivisible. Example: nlp (quota 1) holds a 0.25 workspace and a 2-GPU gang
    over quota; taking the gang leaves 0.25, and 0.25 + 2 > 1, so vision, below its quota,
    may take it; a 0.5 pod that 0.25 + 0.5 <= 1 would let back in may not be taken so."""
    if floor is None or left >= floor:
        return True
    return floor.below and left + smallest > floor


class Eviction:
    cause: EvictionCause
    name: str  # the key of its time in the cycle's timings (``make_room.<name>_s``)
    # What its plans are remembered under within a cycle: ways that take the same victims
    # in the same order share it.
    key: str
    # The waiting workload's reason while its victims exit: "<verb> N workloads of ...".
    verb = "reclaiming GPUs from"
    # Takes from the waiting workload's own project: that frees room in its own quota (the
    # verdict is asked again as if the victims were gone), and a plan that found nothing
    # to take says nothing about another project's work of the same shape.
    own_project = False
    # Where taking victims in the global eviction order cannot make room, look at each
    # node on its own (``MakeRoom.node_plan``).
    per_node_plan = True
    # A single pod goes to the per-node plan at once (the node that needs the fewest
    # evictions), not first through the global eviction order.
    node_plan_first = False
    # Takes only from projects over their quota, other than the waiting workload's (its
    # floor is their quota and ``may_take`` leaves none below it that was not above it):
    # its plans are bounded by ``victims.OverQuotaRoom``.
    over_quota_only = False
    # ``victims_in`` reads the project's usage, not only who is evicted (``Victims.read``
    # keeps what it gave only while that usage stays as it was).
    victims_read_usage = False

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

    def floor(self, c: Cycle, project: str, pool: str) -> Floor | None:
        """What a victim's project keeps in ``pool``; None: no floor."""
        return None

    def stops_at(self, priority: int, w: Workload) -> bool:
        """Are victims from this priority on (in eviction order) out of reach for ``w``?"""
        return False

    def victims_in(self, victims: VictimSource, w: Workload, project: str, pool: str, floor: Floor | None) -> Iterator[Workload]:
        """``project``'s work it may take for ``w``, in the order it takes it: eviction
        order, up to ``stops_at``. No way takes work that just restarted: that is thrash.
        Depends on ``w`` only through ``group``, and on the cycle's state only through who
        was evicted (and the project's usage, where ``victims_read_usage``)."""
        for prio, v, protected in victims.pool_victims(project, pool):
            if self.stops_at(prio, w):
                break
            if not protected:
                yield v

    def reason(self, v: Workload, w: Workload) -> str:
        raise NotImplementedError

    def cause_of(self, v: Workload, w: Workload) -> EvictionCause:
        """The cause its eviction of ``v`` for ``w`` reads."""
        return self.cause


def _others_furthest_above_fair_share(c: Cycle, w: Workload, pool: str) -> list[str]:
    snap = c.snap
    others = [p for p in snap.projects if p != w.project and snap.victims.get(p)]
    return sorted(others, key=lambda p: (c.fair.get((p, pool), 0) - c.work.usage[(p, pool)], p))


class QuotaReclaim(Eviction):
    """For a project below its quota: other projects' over-quota work, the project furthest
    above its fair share first. A victim leaves its project at or above its quota; in the
    second pass (``below``), under it as far as ``may_take`` allows, pieces that each alone
    cross the quota first (``Victims.below_quota_order``).

    ``guaranteed``: for work in quota only because its project's preemptible work does not
    count (``quota.counted_usage``), once that work gave way (preemption) and made no room:
    the GPUs it is guaranteed are held by other projects' over-quota work, which gives way
    next (its own preemptible work then runs over quota, where it can be reclaimed)."""

    cause = EvictionCause.RECLAIM
    over_quota_only = True

    def __init__(self, below: bool = False, guaranteed: bool = False):
        self.below, self.guaranteed = below, guaranteed
        self.victims_read_usage = below  # ``below_quota_order``
        self.name = f"{'guaranteed' if guaranteed else 'quota'}_reclaim{'_below_quota' if below else ''}"
        self.key = "reclaim below quota" if below else "reclaim"

    def enabled(self, cfg: SchedulerConfig) -> bool:
        return cfg.reclaim

    def applies(self, c: Cycle, w: Workload, pool: str, v) -> bool:
        if self.guaranteed:
            return v.allowed and v.guaranteed_only
        # Only while the project's whole usage leaves room in its quota: where its own
        # preemptible work holds the quota, that gives way first (preemption), not another
        # team's borrowed GPUs.
        return v.allowed and not v.over_quota and not v.guaranteed_only

    def projects(self, c: Cycle, w: Workload, pool: str) -> Iterator[str]:
        return iter(_others_furthest_above_fair_share(c, w, pool))

    def floor(self, c: Cycle, project: str, pool: str) -> Floor | None:
        return Floor(c.snap.projects[project].quotas.get(pool, NO_QUOTA).quota_milli, below=self.below)

    def victims_in(self, victims: VictimSource, w: Workload, project: str, pool: str, floor: Floor | None) -> Iterator[Workload]:
        if not self.below:
            yield from super().victims_in(victims, w, project, pool, floor)
        elif floor is not None and victims.work.usage[(project, pool)] > floor:  # at or below its quota nothing is over it
            yield from victims.below_quota_order(project, pool, floor)

    def reason(self, v: Workload, w: Workload) -> str:
        if self.below:
            return (
                f"reclaimed: project {w.project} is below its quota and needs the GPUs for {w.name}; "
                f"{v.name} is taken whole though project {v.project} then holds less than its quota, "
                f"as it would be over that quota if it came back"
            )
        return f"reclaimed: project {w.project} is below its quota and needs the GPUs for {w.name}"


class FairShareReclaim(Eviction):
    """For over-quota work of a project below its fair share of the idle GPUs: other
    projects' work above their fair share, furthest above first; a victim leaves its
    project at or above its fair share, and the waiting workload stays within its own."""

    cause, name, key = EvictionCause.FAIR_SHARE, "fair_share_reclaim", "fair share"

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

    def floor(self, c: Cycle, project: str, pool: str) -> Floor | None:
        return Floor(c.fair.get((project, pool), 0))

    def reason(self, v: Workload, w: Workload) -> str:
        return f"reclaimed for fair share: project {w.project} is below its fair share and needs the GPUs for {w.name}"


class CatchUp(Eviction):
    """For over-quota work of a project below its fair share of the instant and behind its
    share over time (``quota.may_catch_up``): the over-quota work of projects ahead of
    theirs, furthest ahead first; a victim leaves its project at or above its quota.

    It comes after fair-share reclaim, for the work that does not fit the fair share and
    for the work that does where fair-share reclaim found no room: that keeps every victim
    at its fair share, so an indivisible piece of a project only a little above its share
    (an 8-GPU pod 1 GPU above) is out of its reach."""

    cause, name, key = EvictionCause.CATCH_UP, "catch_up", "catch up"
    over_quota_only = True

    def enabled(self, cfg: SchedulerConfig) -> bool:
        return cfg.fair_share_reclaim

    def applies(self, c: Cycle, w: Workload, pool: str, v) -> bool:
        return v.allowed and v.over_quota and bool(catch_up_from(c, w, pool))

    def group(self, c: Cycle, w: Workload, pool: str) -> object:
        return c.milli(w, pool)  # may_catch_up weighs the GPUs asked for

    def projects(self, c: Cycle, w: Workload, pool: str) -> Iterator[str]:
        return iter(catch_up_from(c, w, pool))

    def floor(self, c: Cycle, project: str, pool: str) -> Floor | None:
        return Floor(c.snap.projects[project].quotas.get(pool, NO_QUOTA).quota_milli)

    def reason(self, v: Workload, w: Workload) -> str:
        return (
            f"reclaimed for fair share over time: project {w.project} got less than its share of "
            f"over-quota GPUs lately and needs the GPUs for {w.name}"
        )


class Preempt(Eviction):
    """Lower-priority work of the waiting workload's own project, lowest priority first."""

    cause, name, key = EvictionCause.PREEMPT, "preempt", "preempt"
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
        return outranks(priority, w)

    def reason(self, v: Workload, w: Workload) -> str:
        return f"preempted by higher-priority workload {w.name} of project {w.project}"


class ReclaimWithPreempt(Eviction):
    """For work in its quota where neither reclaim nor preemption alone made room: both at
    once, on one node. Other projects' over-quota work (as the reclaim's second pass takes
    it, ``may_take`` with a ``below`` floor) and its own project's lower-priority work (as
    preemption takes it) together, the fewest victims on the node that needs the fewest;
    work that restarted lately is never taken. A team whose own training sits beside
    another team's borrowed work on the only node that holds its pod gets its quota back
    (record 0070)."""

    cause = EvictionCause.RECLAIM
    name, key = "reclaim_with_preempt", "reclaim with preempt"
    verb = "reclaiming and preempting GPUs from"
    victims_read_usage = True  # ``below_quota_order``
    node_plan_first = True  # the fewest victims: it costs two teams at once

    def enabled(self, cfg: SchedulerConfig) -> bool:
        return cfg.reclaim and cfg.preempt

    def applies(self, c: Cycle, w: Workload, pool: str, v) -> bool:
        # Only where its own project runs work it may preempt (the victims' index is in
        # eviction order, lowest priority first): without it, this is quota reclaim's
        # second pass, which found no room already.
        own = c.snap.victims.get(w.project)
        return v.allowed and not v.over_quota and own is not None and bool(own) and not outranks(own[0][0], w)

    def group(self, c: Cycle, w: Workload, pool: str) -> object:
        return w.effective_priority

    def projects(self, c: Cycle, w: Workload, pool: str) -> Iterator[str]:
        yield from _others_furthest_above_fair_share(c, w, pool)
        yield w.project

    def floor(self, c: Cycle, project: str, pool: str) -> Floor | None:
        return Floor(c.snap.projects[project].quotas.get(pool, NO_QUOTA).quota_milli, below=True)

    def victims_in(self, victims: VictimSource, w: Workload, project: str, pool: str, floor: Floor | None) -> Iterator[Workload]:
        if project == w.project:
            for prio, v, protected in victims.pool_victims(project, pool):
                if outranks(prio, w):
                    break
                if not protected:
                    yield v
        elif floor is not None and victims.work.usage[(project, pool)] > floor:
            yield from victims.below_quota_order(project, pool, floor)

    def reason(self, v: Workload, w: Workload) -> str:
        if v.project == w.project:
            return f"preempted by higher-priority workload {w.name} of project {w.project}"
        return f"reclaimed: project {w.project} is below its quota and needs the GPUs for {w.name}"

    def cause_of(self, v: Workload, w: Workload) -> EvictionCause:
        return EvictionCause.PREEMPT if v.project == w.project else EvictionCause.RECLAIM


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


# In the order of what the waiting workload is owed: its quota first (a guarantee), taking
# victims down to their quota, and only then below it (``may_take``: work that would not fit
# back); then its fair share of the idle GPUs now, then over time (catch up: for a pod past
# that share, or one within it that fair-share reclaim found no room for, since its victims
# keep their fair share); these take back GPUs other projects borrowed. Preemption comes
# next: it is the one way that costs the waiting workload's own team. Last, reclaim for
# guaranteed work whose own project's preemptible work held its quota: that work gives way
# first (preemption), other teams' borrowed GPUs only where that made no room. The two
# reclaim pairs never both apply to one workload (``QuotaReclaim.applies``). Last, for work
# in its quota that none of these made room for: reclaim and preemption together.
EVICTIONS: tuple[Eviction, ...] = (
    QuotaReclaim(),
    QuotaReclaim(below=True),
    FairShareReclaim(),
    CatchUp(),
    Preempt(),
    QuotaReclaim(guaranteed=True),
    QuotaReclaim(below=True, guaranteed=True),
    ReclaimWithPreempt(),
)
