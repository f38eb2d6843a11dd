"""Events: placements, preemptions (with their reason), releases, quota changes."""

from __future__ import annotations

from sqlalchemy import select
from tornado import web

from ... import humanize
from ...db.tables import EventRow
from ...org import roles
from .base import PageHandler


class EventsPage(PageHandler):
    @web.authenticated
    def get(self):
        kind = self.get_argument("kind", "")
        with self.Session() as s:
            q = select(EventRow).order_by(EventRow.id.desc()).limit(self.ctx.cfg.admin_page_size)
            if kind:
                q = q.where(EventRow.kind == kind)
            mine = roles.visible_projects(self.who)
            if mine is not None:
                q = q.where(EventRow.project.in_(mine))
            events = s.scalars(q).all()
        fmt = [(humanize.when(e.ts), e) for e in events]
        self.render_page("events.html", events=fmt, kind=kind)


def routes(prefix):
    return [(prefix + r"/events", EventsPage)]
