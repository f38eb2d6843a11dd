"""A scheduling cycle's actions, in the order they run over the cycle's state
(``scheduler.cycle.Cycle``), as KAI-Scheduler's actions run over a session.

Each action is a class made with the cycle, whose ``run()`` reads and writes the cycle's
state; its ``name`` keys its time in ``Decisions.timings`` (``<name>_s``).
"""

from __future__ import annotations

from typing import Protocol

from ..cycle import Cycle
from .allocate import FairShare, InQuota, KnownWork, Leftovers
from .consolidate import Consolidate
from .make_room import MakeRoom
from .reasons import Reasons

__all__ = ["ACTIONS", "Action"]


class Action(Protocol):
    name: str

    def __init__(self, cycle: Cycle) -> None: ...

    def run(self) -> None: ...


# The order is the promise: guarantees before borrowing, borrowing by fair share before
# first come, and evictions only for what free capacity could not serve.
ACTIONS: tuple[type[Action], ...] = (
    KnownWork,  # what names no project or pool waits, saying so; the rest waits in queue order
    InQuota,  # quota is a guarantee: served first, from free capacity
    FairShare,  # then over-quota work, each project up to its fair share of the idle GPUs
    Leftovers,  # then GPUs nobody else asked for, to anyone allowed over quota
    MakeRoom,  # only then evictions (evictions.EVICTIONS, in their own order) for what still waits
    Consolidate,  # then moves: over-quota work that can restart elsewhere now, to free a whole node
    Reasons,  # last: every workload still waiting says why, with its queue position
)
