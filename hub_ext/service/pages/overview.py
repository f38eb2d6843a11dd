"""Overview: totals and allocation/utilization over time as an SVG chart."""

from __future__ import annotations

import time

from sqlalchemy import func, select
from tornado import web

from ... import humanize
from ...db.tables import SampleRow, WorkloadRow
from ...org import projects as org
from ...org import roles
from .base import PageHandler


def chart_points(samples, width=760, height=180) -> dict:
    if not samples:
        return {"alloc": "", "util": "", "cap": 0, "t0": "", "t1": ""}
    t0, t1 = samples[0].ts, max(samples[-1].ts, samples[0].ts + 1)
    cap = max(s.capacity_milli for s in samples) / 1000 or 1

    def xy(ts, v):
        return f"{(ts - t0) / (t1 - t0) * width:.1f},{height - v / cap * height:.1f}"

    alloc = " ".join(xy(s.ts, s.allocated_milli / 1000) for s in samples)
    util = " ".join(xy(s.ts, (s.utilization_pct or 0) / 100 * cap) for s in samples if s.utilization_pct is not None)
    return {"alloc": alloc, "util": util, "cap": cap, "t0": humanize.when(t0), "t1": humanize.when(t1)}


class OverviewPage(PageHandler):
    @web.authenticated
    def get(self):
        with self.Session() as s:
            mine = roles.visible_projects(self.who)
            counts = dict(s.execute(
                select(WorkloadRow.state, func.count()).group_by(WorkloadRow.state)
                .where(True if mine is None else WorkloadRow.project.in_(mine))
            ).all())
            capacity = org.capacity_gpus(s)
            use = org.usage(s)
            allocated = sum(u["allocated_gpus"] for p, u in use.items() if mine is None or p in mine)
            since = time.time() - 6 * 3600
            samples = s.scalars(select(SampleRow).where(SampleRow.ts >= since).order_by(SampleRow.ts)).all()
            n_projects = s.scalar(select(func.count()).select_from(org.ProjectRow)) if mine is None else len(mine)
        self.render_page("overview.html", counts=counts, capacity=capacity, allocated=allocated,
                         n_projects=n_projects, chart=chart_points(samples))


def routes(prefix):
    return [(prefix + r"/?", OverviewPage)]
