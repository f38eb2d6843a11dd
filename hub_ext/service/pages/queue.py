"""Queue: pending workloads with the scheduler's reason and position, then running ones."""

from __future__ import annotations

from sqlalchemy import func, select
from tornado import web

from ... import roles
from ...db import WorkloadRow
from .base import PageHandler


class QueuePage(PageHandler):
    @web.authenticated
    def get(self):
        size = self.ctx.cfg.admin_page_size
        try:
            page = max(0, int(self.get_argument("page", "0")))
        except ValueError:
            page = 0
        with self.Session() as s:
            base = select(WorkloadRow)
            mine = roles.visible_projects(self.who)
            if mine is not None:
                base = base.where(WorkloadRow.project.in_(mine))
            pending = s.scalars(base.where(WorkloadRow.state == "pending")
                                .order_by(WorkloadRow.project, WorkloadRow.queue_position)
                                .offset(page * size).limit(size)).all()
            running = s.scalars(base.where(WorkloadRow.state != "pending")
                                .order_by(WorkloadRow.start_time.desc())
                                .offset(page * size).limit(size)).all()
            total = s.scalar(select(func.count()).select_from(base.subquery()))
        self.render_page("queue.html", pending=pending, running=running, page=page, size=size,
                         total=total)


def routes(prefix):
    return [(prefix + r"/queue", QueuePage)]
