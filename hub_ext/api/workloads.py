"""REST API v1 of workloads: list, submit, describe, delete, and their output. Members see
the workloads of their own projects, admins all. Workspaces are JupyterHub servers, so
stopping one goes through the hub's API."""

from __future__ import annotations

import time

from sqlalchemy import delete

from .. import validation
from ..attachments import attach
from ..backends import mode
from ..db.events import add_event
from ..db.tables import WorkloadRow, bump_version
from ..org import projects as org
from ..requests.limits import limits_for
from ..requests.rules import parse_request, workload_name
from ..serving.db import InferenceRow
from ..training.db import TrainingRow
from .base import ApiHandler


def workload_dict(w: WorkloadRow) -> dict:
    spec = dict(w.spec or {})
    return {
        "name": w.name, "owner": w.owner, "project": w.project, "kind": w.kind, "state": w.state,
        "server": w.server, "spec": spec,
        "gpu_allocated": round(sum(p["gpu_milli"] * len(p["gpu_indices"]) for p in w.placement) / 1000, 3),
        "placement": w.placement, "over_quota": w.over_quota, "reason": w.reason,
        "queue_position": w.queue_position, "submit_time": w.submit_time, "start_time": w.start_time,
    }


class WorkloadLogsHandler(ApiHandler):
    """A workload's output (a workspace's server log, a command workload's output, an
    inference replica's): the last ``tail`` lines, or with ``offset`` what was written after
    that byte (follow). The mode's backend reads it: the owner's files, or the API server."""

    async def get(self, name):
        tail = validation.integer_arg(self.get_argument("tail", None), "tail", 200, 1, 10_000)
        offset = self.get_argument("offset", None)
        start = None if offset in (None, "") else validation.integer_arg(offset, "offset", 0, 0, 2**62)
        service = ""
        with self.Session() as s:
            w = s.get(WorkloadRow, name)
            if w is None and (svc := _replica_service(s, name)) is not None:
                # on Kubernetes a replica is the chart's activator's pod, not a hub row
                service, kind, owner = svc.name, "replica", svc.owner
                self.require("view", project=svc.project)
            else:
                w = self.viewable(s, WorkloadRow, name, "workload")
                kind, owner = w.kind, w.owner
                if kind == "workspace":  # a workspace's log is its owner's (URLs, kernel output)
                    self.require("read_workspace_log", project=w.project, owner=owner)
        if kind == "training" and _has_job(self, name):
            raise validation.FieldError("name", f"{name} is a training job: see /trainings/{name}/logs?rank=N")
        lines, end = await mode(self.ctx.cfg).workload_log(self.ctx.cfg, name, kind, owner, tail, start, service)
        self.send({"name": name, "lines": lines, "offset": end})


def _replica_service(s, name: str) -> InferenceRow | None:
    """The inference service a replica name (``SERVICE-HEX``) belongs to, if any."""
    service, _, suffix = name.rpartition("-")
    return s.get(InferenceRow, service) if service and len(suffix) == 6 else None


def _has_job(handler: ApiHandler, name: str) -> bool:
    with handler.Session() as s:
        return _training_job(handler, s, name) is not None


class WorkloadsHandler(ApiHandler):
    def get(self):
        q = self.visible(WorkloadRow, WorkloadRow.submit_time, ("kind", "project", "state", "owner"))
        with self.Session() as s:
            rows = s.scalars(q).all()
        self.send({"items": [workload_dict(w) for w in rows]})

    async def post(self):
        data = self.body()
        server = data.pop("server_name", "") if data.get("kind", "workspace") == "workspace" else ""
        owner, mine = self.submitter(data)
        notes: list[str] = []
        with self.Session() as s:
            req = parse_request(data, limits_for(s, self.ctx.cfg, owner, projects=mine), notes)
            attached = attach.check(s, req.project, req.credentials, req.datasources)
        self.deprecated(notes)
        if req.kind == "workspace":
            validation.name(server, "server_name", "server")
            code, body = await self.ctx.hub.start_server(owner, server, req.to_dict())
            if code >= 400:
                self.send_error(code if code in (400, 403, 404, 409) else 502,
                                message=(body or {}).get("message", "the hub refused to start the server"))
                return
            name = workload_name(owner, server)
            row = await self._wait_row(name)
            self.send(row or {"name": name, "kind": "workspace", "state": "starting"}, 202)
            return
        name = req.name or f"{req.kind[:5]}-{owner}-{int(time.time() * 1000) % 10**8}"
        with self.Session() as s:
            if s.get(WorkloadRow, name) is not None and s.get(WorkloadRow, name).state in (
                "pending", "running", "releasing", "stopping"
            ):
                raise org.Conflict("name", f"workload {name!r} already exists")
            s.execute(delete(WorkloadRow).where(WorkloadRow.name == name))
            s.add(WorkloadRow(name=name, owner=owner, project=req.project, kind=req.kind,
                              spec=req.to_dict(), state="pending", submit_time=time.time()))
            add_event(s, "submitted", f"{owner} asked for {req.gpu_label()} ({req.kind})", name, req.project)
            attach.record_use(s, self.username, name, attached, "attach")
            bump_version(s)
            s.commit()
            self.send(workload_dict(s.get(WorkloadRow, name)), 201)

    async def _wait_row(self, name: str, timeout: float = 5.0):
        import asyncio

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.Session() as s:
                w = s.get(WorkloadRow, name)
                if w is not None:
                    return workload_dict(w)
            await asyncio.sleep(0.1)
        return None


class WorkloadHandler(ApiHandler):
    def _get(self, s, name: str) -> WorkloadRow:
        return self.viewable(s, WorkloadRow, name, "workload")

    def get(self, name):
        with self.Session() as s:
            self.send(workload_dict(self._get(s, name)))

    async def delete(self, name):
        with self.Session() as s:
            w = self._get(s, name)
            self.require("manage_workload", project=w.project, owner=w.owner)
            kind, owner, server, state = w.kind, w.owner, w.server, w.state
            job = _training_job(self, s, name) if kind == "training" else None
            if job is not None:  # the job runner's: it ends the job, as DELETE /trainings/NAME
                job.request = "delete"
                add_event(s, "stopped", f"{self.username} deleted training {name}", name, w.project,
                          actor=self.username)
                s.commit()
            elif kind != "workspace":
                if state in ("running", "releasing"):
                    w.state = "stopping"
                else:
                    s.delete(w)
                add_event(s, "stopped", f"{self.username} stopped {name}", name, w.project,
                          actor=self.username)
                bump_version(s)
                s.commit()
        if kind == "workspace":
            code, body = await self.ctx.hub.stop_server(owner, server)
            if code >= 400 and code != 404:
                self.send_error(502, message=(body or {}).get("message", "the hub could not stop it"))
                return
        self.set_status(204)
        self.finish()


def _training_job(handler: ApiHandler, s, name: str):
    """The trainings API's row of a job, if the job runner holds ``name``."""
    return s.get(TrainingRow, name)


__all__ = ["WorkloadHandler", "WorkloadLogsHandler", "WorkloadsHandler", "workload_dict"]
