"""REST API v1: departments, projects, workloads, nodes, events, samples, me.

Reads: members see their own projects and the workloads in them; admins see everything.
Writes to the organisation need ``custom:gpupool:admin``. Workspaces are JupyterHub
servers, so starting or stopping one goes through the hub's API.
"""

from __future__ import annotations

import json
import pwd
import time
from pathlib import Path

import yaml
from sqlalchemy import delete, select
from sqlalchemy.exc import IntegrityError
from tornado.web import HTTPError

from gpupool.errors import GpupoolError
from hub_ext.inference import api as inference_api

from .. import attach, audit, capacity, org, roles, sshkeys, validation
from ..backends import mode
from ..db import EventRow, SampleRow, WorkloadRow, bump_version
from ..events import add_event
from ..host.accounts import Accounts
from ..launch import output_log, read_from
from ..limits import limits_for
from ..requests import parse_request, workload_name
from ..sharing import gpu_sharing
from ..ssh.gateway import public_host_key
from ..training.db import TrainingRow
from . import governance_api, policy_api, roles_api, training_api, usage_api
from .base import ApiHandler

SPEC = Path(__file__).parent / "openapi.yaml"
MAX_LOG_BYTES = 1 << 20


def workload_dict(w: WorkloadRow) -> dict:
    spec = dict(w.spec or {})
    return {
        "name": w.name, "owner": w.owner, "project": w.project, "kind": w.kind, "state": w.state,
        "server": w.server, "spec": spec,
        "gpu_allocated": round(sum(p["gpu_milli"] * len(p["gpu_indices"]) for p in w.placement) / 1000, 3),
        "placement": w.placement, "over_quota": w.over_quota, "reason": w.reason,
        "queue_position": w.queue_position, "submit_time": w.submit_time, "start_time": w.start_time,
    }


class RootHandler(ApiHandler):
    def get(self):
        self.send({"version": "v1", "openapi": self.reverse_url("openapi")})


class OpenAPIHandler(ApiHandler):
    def prepare(self):  # the description is public
        pass

    def get(self):
        self.send(yaml.safe_load(SPEC.read_text()))


class MeHandler(ApiHandler):
    def get(self):
        with self.Session() as s:
            projects = org.projects_of(s, self.username)
        cfg = self.ctx.cfg
        self.send({"name": self.username, "admin": self.is_admin, "projects": projects,
                   "ssh_port": cfg.ssh_port, "ssh_host": cfg.ssh_host or self.request.host_name,
                   "ssh_host_key": public_host_key(cfg.state_dir) if cfg.ssh_port else ""})


class MeSshKeysHandler(ApiHandler):
    """The public keys that log the user in through the SSH gateway."""

    def get(self):
        with self.Session() as s:
            self.send({"keys": sshkeys.keys_of(s, self.username)})

    def put(self):
        data = self.body()
        validation.check_fields(data, {"keys"})
        keys = validation.ssh_keys(data.get("keys"), "keys")
        with self.Session() as s:
            sshkeys.set_keys(s, self.username, keys)
            s.commit()
        self.send({"keys": keys})


class WorkloadLogsHandler(ApiHandler):
    """A workload's output (a workspace's server log, a command workload's output.log):
    the last ``tail`` lines, or with ``offset`` what was written after that byte (follow)."""

    def get(self, name):
        tail = validation.integer_arg(self.get_argument("tail", None), "tail", 200, 1, 10_000)
        offset = self.get_argument("offset", None)
        start = None if offset in (None, "") else validation.integer_arg(offset, "offset", 0, 0, 2**62)
        with self.Session() as s:
            w = self.viewable(s, WorkloadRow, name, "workload")
            kind, owner = w.kind, w.owner
            if kind == "workspace":  # a workspace's log is its owner's (URLs, kernel output)
                self.require("read_workspace_log", project=w.project, owner=owner)
        if kind == "training" and _has_job(self, name):
            raise validation.FieldError("name", f"{name} is a training job: see /trainings/{name}/logs?rank=N")
        cfg = self.ctx.cfg
        try:
            acct = pwd.getpwnam(Accounts(cfg.accounts, prefix=cfg.account_prefix, home_root=cfg.home_root,
                                         template=cfg.account_template or None).name_for(owner))
        except (KeyError, GpupoolError):
            self.send({"name": name, "lines": [], "offset": 0})
            return
        kinds = ["workspace"] if kind == "workspace" else ["replica", "command"]
        paths = [output_log(acct.pw_dir, k, name) for k in kinds]
        path = next((p for p in paths if p.exists()), paths[-1])
        text, end = read_from(path, acct.pw_uid, start, MAX_LOG_BYTES)
        lines = text.splitlines()
        self.send({"name": name, "lines": lines if start is not None else lines[-tail:], "offset": end})


def _has_job(handler: ApiHandler, name: str) -> bool:
    with handler.Session() as s:
        return _training_job(handler, s, name) is not None


class OrgWriter(ApiHandler):
    """Writes to the organisation. On Kubernetes the Department/Project object is written
    first (hub_ext.k8s_org: the truth), checked beforehand against the database's copy with
    the same rules; the copy, its event and its audit entry follow."""

    kind = "project"

    async def change_org(self, change, name: str | None, *args, deleted: bool = False):
        if not mode(self.ctx.cfg).org_in_cluster:
            return await self.off_loop(self._commit, change, args)
        from .. import k8s_org  # aiohttp and kubernetes_asyncio: the k8s extra

        out = await self.off_loop(self._check, change, args)
        name = name or out["name"]
        # pools the body takes the quota away from (``"pools": {"fast": null}``; checked above)
        removed = tuple(p for a in args if isinstance(a, dict) and isinstance(a.get("pools"), dict)
                        for p, q in a["pools"].items() if q is None)
        try:
            await k8s_org.publish(await k8s_org.client(self.ctx.cfg.kubeconfig), self.kind, name,
                                  None if deleted else out, removed)
        except k8s_org.Unavailable as e:
            raise HTTPError(503, reason=str(e).replace("\n", " ")[:400]) from None
        try:
            return await self.off_loop(self._commit, change, args)
        except (org.Conflict, org.NotFound, IntegrityError):  # the watch copied the object first
            if deleted:
                return None
            if change in (org.create_department, org.create_project):  # the rest: members
                return await self.off_loop(self._created_by_watch, name, args[0])
            with self.Session() as s:
                return getattr(org, f"get_{self.kind}")(s, name)

    def _check(self, change, args):
        with self.Session() as s:
            out = change(s, *args, actor=self.username)
            s.rollback()
        return out

    def _created_by_watch(self, name: str, data: dict) -> dict:
        rest = {k: v for k, v in data.items() if k != "name"}
        with self.Session() as s:
            out = getattr(org, f"update_{self.kind}")(s, name, rest, actor=self.username)
            audit.record(s, self.username, f"{self.kind}.created", name, rest,
                         name if self.kind == "project" else "")
            s.commit()
        return out

    def _commit(self, change, args):
        with self.Session() as s:
            out = change(s, *args, actor=self.username)
            s.commit()
        return out


class DepartmentsHandler(OrgWriter):
    kind = "department"

    def get(self):
        seen = roles.visible_departments(self.who)
        with self.Session() as s:
            depts = [d for d in org.list_departments(s) if seen is None or d["name"] in seen]
        self.send({"items": depts})

    async def post(self):
        self.require("manage_department")
        self.send(await self.change_org(org.create_department, None, self.body()), 201)


class DepartmentHandler(OrgWriter):
    kind = "department"

    def get(self, name):
        with self.Session() as s:
            d = org.get_department(s, name)
        self.require("view", department=name)
        self.send(d)

    async def patch(self, name):
        self.require("manage_department", department=name)
        self.send(await self.change_org(org.update_department, name, name, self.body()))

    async def delete(self, name):
        self.require("manage_department", department=name)
        await self.change_org(org.delete_department, name, name, deleted=True)
        self.set_status(204)
        self.finish()


class ProjectsHandler(OrgWriter):
    def get(self):
        with self.Session() as s:
            self.send({"items": org.list_projects(s, roles.visible_projects(self.who))})

    async def post(self):
        data = self.body()
        dept = data.get("department")
        self.require("manage_project", department=dept if isinstance(dept, str) else "")
        self.send(await self.change_org(org.create_project, None, data), 201)


class ProjectHandler(OrgWriter):
    def get(self, name):
        self.require_project("view", name)
        with self.Session() as s:
            self.send(org.get_project(s, name))

    async def patch(self, name):
        data = self.body()
        self.require_project("manage_project", name)
        if isinstance(data.get("department"), str):  # moving it: the new department's admin too
            self.require("manage_project", department=data["department"])
        self.send(await self.change_org(org.update_project, name, name, data))

    async def delete(self, name):
        self.require_project("manage_project", name)
        await self.change_org(org.delete_project, name, name, deleted=True)
        self.set_status(204)
        self.finish()


class WorkloadsHandler(ApiHandler):
    def get(self):
        q = select(WorkloadRow).order_by(WorkloadRow.submit_time)
        for key in ("kind", "project", "state", "owner"):
            v = self.get_argument(key, None)
            if v:
                q = q.where(getattr(WorkloadRow, key) == v)
        seen = roles.visible_projects(self.who)
        if seen is not None:
            q = q.where(WorkloadRow.project.in_(seen))
        with self.Session() as s:
            rows = s.scalars(q).all()
        self.send({"items": [workload_dict(w) for w in rows]})

    async def post(self):
        data = self.body()
        server = data.pop("server_name", "") if data.get("kind", "workspace") == "workspace" else ""
        owner = validation.name(data.pop("owner", self.username), "owner", "user")
        if owner != self.username:
            self.require("submit_for_others", project=data.get("project"))
        self.require_submit(data)
        mine = tuple(roles.submit_projects(self.who)) if owner == self.username else None
        with self.Session() as s:
            req = parse_request(data, limits_for(s, self.ctx.cfg, owner, projects=mine))
            attached = attach.check(s, req.project, req.credentials, req.datasources)
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


class NodesHandler(ApiHandler):
    def get(self):
        self.require("view_cluster")
        with self.Session() as s:
            nodes, share = gpu_sharing(s, roles.visible_projects(self.who))
        items = []
        for n in nodes:
            gpus = []
            for g in n.gpus:
                users = share.get((n.name, g["index"]), [])
                users = [{k: u[k] for k in ("workload", "project", "gpu")} for u in users]
                gpus.append({**{k: v for k, v in g.items() if k != "pods"}, "allocated": round(sum(u["gpu"] for u in users), 3), "workloads": users})
            items.append({"name": n.name, "pool": n.pool, "source": n.source, "cpu_milli": n.cpu_milli,
                          "memory_mib": n.memory_mib, "gpus": gpus})
        self.send({"items": items})


class CapacityHandler(ApiHandler):
    """The spawn form's live figures (hub_ext.capacity) for the projects the caller may
    submit to."""

    def get(self):
        mine = tuple(roles.submit_projects(self.who))
        with self.Session() as s:
            self.send(capacity.status(s, limits_for(s, self.ctx.cfg, self.username, projects=mine)))

    def post(self):
        """The live figures with ``request``: what Start would answer to the body (the spawn
        form's fields, or a POST /workloads body), by the request rules themselves."""
        data = self.body()
        mine = tuple(roles.submit_projects(self.who))
        with self.Session() as s:
            limits = limits_for(s, self.ctx.cfg, self.username, projects=mine)
            self.send({**capacity.status(s, limits), "request": capacity.answer(s, limits, data)})


class EventsHandler(ApiHandler):
    def get(self):
        limit = validation.integer_arg(self.get_argument("limit", None), "limit", 100, 1, 1000)
        q = select(EventRow).order_by(EventRow.id.desc()).limit(limit)
        for key in ("kind", "project", "workload"):
            v = self.get_argument(key, None)
            if v:
                q = q.where(getattr(EventRow, key) == v)
        seen = roles.visible_projects(self.who)
        if seen is not None:
            q = q.where(EventRow.project.in_(seen))
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


def routes(prefix: str) -> list:
    from tornado.web import url

    a = prefix + "api/v1"
    n = r"([a-z0-9-]+|[^/]+)"
    return [
        url(a + "/?", RootHandler),
        url(a + "/openapi.json", OpenAPIHandler, name="openapi"),
        url(a + "/me", MeHandler),
        url(a + "/me/ssh-keys", MeSshKeysHandler),
        url(a + "/departments", DepartmentsHandler),
        *policy_api.routes(a),
        url(a + f"/departments/{n}", DepartmentHandler),
        url(a + "/projects", ProjectsHandler),
        url(a + f"/projects/{n}", ProjectHandler),
        url(a + "/workloads", WorkloadsHandler),
        url(a + f"/workloads/{n}", WorkloadHandler),
        url(a + f"/workloads/{n}/logs", WorkloadLogsHandler),
        url(a + "/nodes", NodesHandler),
        url(a + "/capacity", CapacityHandler),
        url(a + "/events", EventsHandler),
        url(a + "/samples", SamplesHandler),
        *training_api.routes(a),
        *roles_api.routes(a),
        *usage_api.routes(a),
        *governance_api.routes(a),
        *inference_api.routes(a),
    ]


__all__ = ["routes", "workload_dict", "json"]
