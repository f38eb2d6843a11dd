"""Which running work may give way for a waiting workload: the guarantee's rules on
victims, one place for each, read by the scheduler's ways of making room
(``actions.evictions``, ``actions.victims``, ``actions.consolidate``) and by the replay's
meters that judge whether the rules let a waiting pod start (``sim.startable``,
``bench/replay_wait_causes.py``). A meter that reads another notion of "allowed" than the
rules counts misses the rules never promised, or hides ones they did (record 0070).

*Protected* work stays whatever the waiting workload needs (``protection`` says why):
  resumed lately      restarted after an eviction within ``resume_protection_s``: taking it
                      again would be thrash;
  not preemptible     a workspace or an inference service inside its team's quota; work of
                      any kind that runs over its team's quota borrowed those GPUs and is
                      not protected so (``evictable``);
  own project         the waiting workload's own project's work of its priority or higher
                      (a project preempts only its lower-priority work for its own);
  other project in quota  another project's work while that project holds no more than its
                      quota (the in-quota promise; how far below its quota reclaim may take
                      an indivisible piece is ``actions.evictions.may_take``).
"""

from __future__ import annotations

from .model import Workload

PROTECTIONS = ("resumed lately", "not preemptible", "own project", "other project in quota")


def evictable(v: Workload) -> bool:
    """May the scheduler ever evict running ``v``? Preemptible work; and work of any kind
    placed over its team's quota: it borrowed GPUs, and a team returning to its quota takes
    them back whatever kind of work borrowed them (a borrowing workspace is preemptible by
    definition)."""
    return v.is_preemptible or v.over_quota


def resumed_lately(v: Workload, now: float | None, resume_protection_s: float) -> bool:
    """Restarted after an eviction less than ``resume_protection_s`` ago: evicting or moving
    it again would be thrash."""
    since = v.started_at
    return v.resumed and now is not None and since is not None and now - since < resume_protection_s


def outranks(priority: int, w: Workload) -> bool:
    """Of ``w``'s own project, is work of ``priority`` out of reach for ``w`` (its priority
    or higher)?"""
    return priority >= w.effective_priority


def protection(v: Workload, w: Workload, v_project_over_quota: bool, now: float | None,
               resume_protection_s: float) -> str | None:
    """Why running ``v`` stays whatever ``w`` needs (one of ``PROTECTIONS``), or None where
    the rules let it go for ``w``. ``v_project_over_quota``: whether ``v``'s project holds
    more than its quota."""
    if resumed_lately(v, now, resume_protection_s):
        return PROTECTIONS[0]
    if not evictable(v):
        return PROTECTIONS[1]
    if v.project == w.project:
        return PROTECTIONS[2] if outranks(v.effective_priority, w) else None
    return None if v_project_over_quota else PROTECTIONS[3]
