"""Usage: GPU-hours by user, project or department for a date range, as a bar chart and a
table, with measured utilization beside the allocation where NVML samples exist (admins)."""

from __future__ import annotations

from tornado import web

from ... import accounting
from ...requests import FieldError
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


class UsagePage(PageHandler):
    @web.authenticated
    def get(self):
        if not self.is_admin:
            raise web.HTTPError(403, "GPU-hours are for gpupool platform admins")
        args = {k: self.get_argument(k, "") for k in ("from", "to", "by")}
        error, rep = None, None
        try:
            start, end, by = accounting.parse_range(args)
            with self.Session() as s:
                rep = accounting.report(s, start, end, by)
        except FieldError as e:
            self.set_status(400)
            error = f"{e.field}: {e.message}"
        self.render_page("usage.html", args=args, error=error, rep=rep,
                         rows=bars(rep["items"]) if rep else [], bar_width=BAR_WIDTH, idle_pct=IDLE_PCT,
                         groups=accounting.GROUPS, query=self.request.query)


def routes(prefix):
    return [(prefix + r"/usage", UsagePage)]
