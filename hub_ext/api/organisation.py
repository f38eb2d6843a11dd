"""REST API v1 of the organisation: departments and projects. Reads: members see their own
projects; writes need ``custom:gpupool:admin``."""

from __future__ import annotations

from sqlalchemy.exc import IntegrityError
from tornado.web import HTTPError

from ..backends import mode
from ..db import audit
from ..org import projects as org
from ..org import roles
from .base import ApiHandler


class OrgWriter(ApiHandler):
    """Writes to the organisation. On Kubernetes the Department/Project object is written
    first (hub_ext.cluster.org: the truth), checked beforehand against the database's copy with
    the same rules; the copy, its event and its audit entry follow."""

    kind = "project"

    async def change_org(self, change, name: str | None, *args, deleted: bool = False):
        if not mode(self.ctx.cfg).org_in_cluster:
            return await self.off_loop(self._commit, change, args)
        from ..cluster import org as cluster_org  # aiohttp and kubernetes_asyncio: the k8s extra

        out = await self.off_loop(self._check, change, args)
        name = name or out["name"]
        # pools the body takes the quota away from (``"pools": {"fast": null}``; checked above)
        removed = tuple(p for a in args if isinstance(a, dict) and isinstance(a.get("pools"), dict)
                        for p, q in a["pools"].items() if q is None)
        try:
            await cluster_org.publish(await cluster_org.client(self.ctx.cfg.kubeconfig), self.kind, name,
                                  None if deleted else out, removed)
        except cluster_org.Unavailable as e:
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


__all__ = ["DepartmentHandler", "DepartmentsHandler", "OrgWriter", "ProjectHandler", "ProjectsHandler"]
