"""REST API v1 of the event log (``/events``) and the capacity samples (``/samples``)."""

from __future__ import annotations

import time

from sqlalchemy import select

from .. import validation
from ..db.tables import EventRow, SampleRow
from .base import ApiHandler


class EventsHandler(ApiHandler):
    def get(self):
        limit = validation.integer_arg(self.get_argument("limit", None), "limit", 100, 1, 1000)
        q = self.visible(EventRow, EventRow.id.desc(), ("kind", "project", "workload")).limit(limit)
        with self.Session() as s:
            rows = s.scalars(q).all()
        self.send({"items": [{"id": e.id, "ts": e.ts, "kind": e.kind, "workload": e.workload,
                              "project": e.project, "message": e.message} for e in rows]})


class SamplesHandler(ApiHandler):
    def get(self):
        self.require("view_cluster")
        since = self.get_argument("since", None)
        since = time.time() - 86400 if since in (None, "") else validation.unix_time(since, "since")
        with self.Session() as s:
            rows = s.scalars(select(SampleRow).where(SampleRow.ts >= since).order_by(SampleRow.ts)).all()
        self.send({"items": [{"ts": r.ts, "capacity": r.capacity_milli / 1000,
                              "allocated": r.allocated_milli / 1000,
                              "utilization_pct": r.utilization_pct} for r in rows]})


__all__ = ["EventsHandler", "SamplesHandler"]
