"""Queue: pending workloads with the scheduler's reason and position, then the ones that
hold or may hold GPUs, then the finished ones, then the inference services with their state
(as their activator last wrote it)."""

from __future__ import annotations

from sqlalchemy import func, select
from tornado import web

from ... import validation
from ...db.tables import FINISHED, WorkloadRow
from ...org import roles
from ...serving.db import InferenceRow
from .base import PageHandler


class QueuePage(PageHandler):
    @web.authenticated
    def get(self):
        size = self.ctx.cfg.admin_page_size
        try:
            page = validation.integer_arg(self.get_argument("page", None), "page", 0, 0, 1_000_000)
        except validation.FieldError as e:
            raise web.HTTPError(400, str(e)) from None
        with self.Session() as s:
            base = select(WorkloadRow)
            mine = roles.visible_projects(self.who)
            if mine is not None:
                base = base.where(WorkloadRow.project.in_(mine))
            pending = s.scalars(base.where(WorkloadRow.state == "pending")
                                .order_by(WorkloadRow.project, WorkloadRow.queue_position)
                                .offset(page * size).limit(size)).all()
            running = s.scalars(base.where(WorkloadRow.state.not_in(("pending", *FINISHED)))
                                .order_by(WorkloadRow.start_time.desc())
                                .offset(page * size).limit(size)).all()
            finished = s.scalars(base.where(WorkloadRow.state.in_(FINISHED))
                                 .order_by(WorkloadRow.start_time.desc())
                                 .offset(page * size).limit(size)).all()
            total = s.scalar(select(func.count()).select_from(base.subquery()))
            services = select(InferenceRow).order_by(InferenceRow.project, InferenceRow.name)
            if mine is not None:
                services = services.where(InferenceRow.project.in_(mine))
            inference = s.scalars(services.limit(size)).all()
        self.render_page("queue.html", pending=pending, running=running, finished=finished, page=page, size=size,
                         total=total,
                         inference=inference)


def routes(prefix):
    return [(prefix + r"/queue", QueuePage)]
