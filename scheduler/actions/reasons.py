"""The reasons action: every workload left waiting says why, with its queue position."""

from __future__ import annotations

from ..cycle import Cycle
from ..model import MILLI, Pending, Workload


class Reasons:
    name = "reasons"

    def __init__(self, cycle: Cycle):
        self.cycle = cycle

    def run(self) -> None:
        c = self.cycle
        position = 0
        for w in c.order:
            if w.name in c.placed and w.name not in c.reserved:
                continue
            position += 1
            reason = c.why.get(w.name) or self._over_quota_reason(w)
            if isinstance(reason, tuple):  # (pool, what): a capacity miss
                ahead = position - 1
                reason = f"no node in {reason[0]} has {reason[1]} free; {ahead} workload{'s' if ahead != 1 else ''} ahead"
            c.decisions.pending.append(Pending(w.name, reason, position))

    def _over_quota_reason(self, w: Workload) -> str:
        c = self.cycle
        pool = c.pools_for(w)[0]
        used = c.work.usage[(w.project, pool)] / MILLI
        fair = c.fair.get((w.project, pool), 0) / MILLI
        return (
            f"project {w.project} is over its quota ({used:g} GPUs in use) and its fair share "
            f"of idle GPUs ({fair:g}) is taken"
        )
