"""Usage: GPU-hours by user, project or department for a date range, as a bar chart and a
table, with measured utilization beside the allocation where NVML samples exist (admins)."""

from __future__ import annotations

import time

from sqlalchemy import select
from tornado import web

from ...db import accounting
from ...db.tables import WorkloadRow
from ...host.activity import is_fraction, reader
from ...requests.rules import FieldError
from .base import PageHandler

IDLE_PCT = 20.0  # rows under this measured utilization are marked idle
BAR_WIDTH = 560


def bars(items: list[dict]) -> list[dict]:
    """Bar lengths in pixels for the allocated and the used GPU-hours of each row."""
    top = max((r["gpu_hours"] for r in items), default=0) or 1
    return [{**r, "alloc_px": round(r["gpu_hours"] / top * BAR_WIDTH, 1),
             "used_px": round((r["used_gpu_hours"] or 0) / top * BAR_WIDTH, 1),
             "idle": r["utilization_pct"] is not None and r["utilization_pct"] < IDLE_PCT}
            for r in items]


def fraction_activity(rows: list[WorkloadRow], idle_s: float, now: float, state_dir: str) -> list[dict]:
    """Running fractions with the interception library's count of their launches and
    allocations, idle when nothing was counted for ``idle_s`` (the culler's timeout)."""
    out = []
    workload_activity = reader(state_dir)
    for w in rows:
        if not is_fraction(w.placement):
            continue
        act = workload_activity(w.name)
        last = act.last_active_s if act else None
        out.append({"name": w.name, "project": w.project, "owner": w.owner, "placement": w.placement,
                    "launches": act.launches if act else None, "allocs": act.allocs if act else None,
                    "last": last, "idle": bool(act) and now - max(last or 0, w.start_time or 0) > idle_s})
    return out


class UsagePage(PageHandler):
    @web.authenticated
    def get(self):
        if not self.is_admin:
            raise web.HTTPError(403, f"{self.username} is not a platform admin: GPU-hours are for platform admins")
        args = {k: self.get_argument(k, "") for k in ("from", "to", "by")}
        error, rep, activity = None, None, []
        try:
            start, end, by = accounting.parse_range(args)
            with self.Session() as s:
                rep = accounting.report(s, start, end, by)
                running = s.scalars(select(WorkloadRow).where(WorkloadRow.state == "running")).all()
                activity = fraction_activity(running, self.ctx.cfg.cull_idle_s or 3600, time.time(),
                                             self.ctx.cfg.state_dir)
        except FieldError as e:
            self.set_status(400)
            error = f"{e.field}: {e.message}"
        self.render_page("usage.html", args=args, error=error, rep=rep,
                         rows=bars(rep["items"]) if rep else [], bar_width=BAR_WIDTH, idle_pct=IDLE_PCT,
                         groups=accounting.GROUPS, query=self.request.query, activity=activity)


def routes(prefix):
    return [(prefix + r"/usage", UsagePage)]
