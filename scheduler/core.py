"""``decide(snapshot) -> Decisions``: one pure, deterministic scheduling cycle.

The cycle reads top to bottom, one action after another (``scheduler.actions.ACTIONS``)
over the cycle's state (``scheduler.cycle.Cycle``):
  0. working copy   copy free capacity and usage; compute fair shares per pool
  1. known work     work naming no project or pool waits, saying so
  2. in quota       place work that fits its project's (and department's) quota
  3. fair share     place over-quota work, least-served project (by weight) first,
                    as far as each project's fair share of the idle GPUs goes
  4. leftovers      let over-quota work use GPUs nobody else asked for (up to limits),
                    the project furthest behind its share over time first
  5. make room      for work still waiting: reclaim over-quota GPUs for projects below
                    quota, then for projects below fair share (now, or over time:
                    Snapshot.over_quota_lag, quota.may_catch_up), then preempt lower
                    priority work of the same project; fewest evictions that make room
                    (``actions.evictions.EVICTIONS``)
  6. reasons        every workload left waiting says why, with its queue position
Every step works on the cycle's copy inside trials that undo what they do not keep;
nothing outside changes. Each action's time is in ``Decisions.timings`` (``<name>_s``).
"""

from __future__ import annotations

import gc
import time

from .actions import ACTIONS
from .cycle import Cycle
from .model import Decisions
from .snapshot import Snapshot

__all__ = ["decide"]


def decide(snapshot: Snapshot) -> Decisions:
    # The cyclic garbage collector waits until the cycle ends: a full pass walks every object
    # the snapshot holds (~0.4 s at 140,000 running pods), and where one fell inside a cycle
    # its time grew with the running pods, not the pending work. A cycle makes no garbage
    # that needs it (reference counting frees what it drops).
    paused = gc.isenabled()
    if paused:
        gc.disable()
    try:
        return _run(Cycle(snapshot))
    finally:
        if paused:
            gc.enable()


def _run(cycle: Cycle) -> Decisions:
    timings = cycle.decisions.timings
    t0 = time.perf_counter()
    for action in ACTIONS:
        t = time.perf_counter()
        action(cycle).run()
        timings[f"{action.name}_s"] = time.perf_counter() - t
    timings["actions_s"] = time.perf_counter() - t0
    return cycle.decisions
