"""REST API v1 for training jobs: /trainings (list, submit), /trainings/NAME (describe,
delete), /trainings/NAME/suspend|resume, /trainings/NAME/logs.

The service writes jobs and control requests; the hub process's training backend (the job
runner or, on Kubernetes, the training controller: hub_ext/backends.py) picks them up within
its poll period. Members see and submit
in their own projects; the owner or an admin may delete, suspend or resume.
"""

from __future__ import annotations

from sqlalchemy import select

from .. import validation
from ..backends import mode
from ..db.tables import EventRow, WorkloadRow
from ..org import projects as org
from ..requests.limits import limits_for
from ..training.db import (
    STATUSES,
    TrainingRow,
    add_training,
    is_active,
    training_dict,
)
from ..training.spec import MAX_WORKERS, parse_training
from ..validation import FieldError
from .base import ApiHandler


class _Base(ApiHandler):
    def _get(self, s, name: str) -> TrainingRow:
        return self.viewable(s, TrainingRow, name, "training")


class TrainingsHandler(_Base):
    def get(self):
        status = self.get_argument("status", None)
        if status and status not in STATUSES:
            raise FieldError("status", f"must be one of {', '.join(STATUSES)}, got {validation.show(status)}")
        q = self.visible(TrainingRow, TrainingRow.created, ("project", "status"))
        with self.Session() as s:
            rows = s.scalars(q).all()
            self.send({"items": [training_dict(t, s.get(WorkloadRow, t.name)) for t in rows]})

    def post(self):
        data = self.body()
        owner, mine = self.submitter(data)
        notes: list[str] = []
        with self.Session() as s:
            spec = parse_training(data, limits_for(s, self.ctx.cfg, owner, projects=mine), notes)
            self.deprecated(notes)
            old = s.get(TrainingRow, spec.name)
            if is_active(old) or (old is None and _workload_active(s, spec.name)):
                raise org.Conflict("name", f"a workload named {spec.name!r} already exists; "
                                   "delete it or choose another name")
            add_training(s, owner, spec)
            s.commit()
            self.send(training_dict(s.get(TrainingRow, spec.name), s.get(WorkloadRow, spec.name)), 201)


def _workload_active(s, name: str) -> bool:
    w = s.get(WorkloadRow, name)
    return w is not None and w.state in ("submitted", "pending", "running", "releasing", "stopping")


class _Requests(_Base):
    """Control requests (delete, suspend, resume) the job runner carries out."""

    def _request(self, name: str, what: str) -> dict:
        with self.Session() as s:
            t = self._get(s, name)
            self.require("manage_workload", project=t.project, owner=t.owner)
            if t.request == "delete" and what != "delete":
                # The delete stands: a later request would take its place in the one slot
                # the runner reads, and the job the owner deleted would stay.
                raise org.Conflict("status", f"cannot {what} a job that is being deleted")
            if what == "suspend" and t.status in ("Succeeded", "Failed", "Suspended"):
                raise org.Conflict("status", f"cannot suspend a job that is {t.status}")
            if what == "resume" and t.status != "Suspended":
                raise org.Conflict("status", f"only a Suspended job can be resumed; this one is {t.status}")
            t.request, t.request_reason = what, ""
            s.commit()
            return training_dict(t, s.get(WorkloadRow, name))


class TrainingHandler(_Requests):
    def get(self, name):
        with self.Session() as s:
            t = self._get(s, name)
            out = training_dict(t, s.get(WorkloadRow, name))
            events = s.scalars(select(EventRow).where(EventRow.workload == name).order_by(EventRow.id)).all()
            out["events"] = [{"ts": e.ts, "kind": e.kind, "message": e.message} for e in events]
        self.send(out)

    def delete(self, name):
        self._request(name, "delete")
        self.set_status(202)
        self.finish()


class TrainingActionHandler(_Requests):
    """POST only: GET or DELETE on /suspend and /resume is 405."""

    def post(self, name, action):
        self.send(self._request(name, action), 202)


class TrainingLogsHandler(_Base):
    async def get(self, name):
        tail = validation.integer_arg(self.get_argument("tail", None), "tail", 200, 1, 10_000)
        rank = validation.integer_arg(self.get_argument("rank", None), "rank", 0, 0, MAX_WORKERS - 1)
        with self.Session() as s:
            t = self._get(s, name)
            workers = int(t.spec.get("workers", 1))
        if not 0 <= rank < workers:
            raise FieldError("rank", f"must be from 0 to {workers - 1}, got {rank}")
        lines = await mode(self.ctx.cfg).worker_log(self.ctx.cfg, name, rank, tail)
        self.send({"name": name, "rank": rank, "lines": lines})


def routes(api: str) -> list:
    """Routes under ``api`` (the prefix ending in api/v1)."""
    from tornado.web import url

    n = r"([a-z0-9-]+|[^/]+)"
    return [
        url(api + "/trainings", TrainingsHandler),
        url(api + f"/trainings/{n}", TrainingHandler),
        url(api + f"/trainings/{n}/(suspend|resume)", TrainingActionHandler),
        url(api + f"/trainings/{n}/logs", TrainingLogsHandler),
    ]
