"""REST API v1 of governance: project credentials and data sources, and the audit log.

    /projects/{project}/credentials          GET list (names, keys, timestamps), POST create
    /projects/{project}/credentials/{name}   GET one (never a value), DELETE
    /projects/{project}/datasources          GET list, POST create
    /projects/{project}/datasources/{name}   GET one, DELETE
    /audit                                   GET entries (actor, action, project, since,
                                             until, limit, offset), newest first

Every permission check of this module goes through hub_ext.org.roles (``_require`` and
``audit_scope``: manage_credentials, use_credentials, view_audit).
"""

from __future__ import annotations

import logging

from ..attachments import credentials, datasources
from ..db import audit
from ..org import projects as org
from ..org import roles
from .base import ApiHandler

log = logging.getLogger("gpupool.service")


def _require(h: ApiHandler, action: str, project: str | None = None) -> None:
    """403 (with the rule's reason) unless hub_ext.org.roles allows ``action`` on ``project``:
    manage_credentials (platform admins, the project's department admins), use_credentials
    (also the project's members)."""
    h.require(action, project=project)


def audit_scope(who: roles.Who) -> dict:
    """What audit entries ``who`` may read, as audit.query's ``projects``/``departments``:
    everything (platform admins); a department admin their departments and their projects;
    anyone else gets 403."""
    if who.platform_admin:
        return {}
    if who.admin_of:
        return {"projects": {p for p, d in who.departments.items() if d in who.admin_of},
                "departments": set(who.admin_of)}
    roles.check(who, "view_audit")  # raises Forbidden with the reason
    return {"projects": set(), "departments": set()}


def _project_exists(h: ApiHandler, s, project: str) -> None:
    if s.get(org.ProjectRow, project) is None:
        raise org.NotFound(f"project {project!r} does not exist")


class _ProjectItems(ApiHandler):
    """Shared shape of the credentials and data sources handlers."""

    store = credentials  # the module with create / delete / get / list_for
    what = "credential"

    def _create(self, s, project: str, data: dict) -> dict:
        return self.store.create(s, project, data, self.username)

    def get(self, project, name=None):
        _require(self, "use_credentials", project)
        with self.Session() as s:
            _project_exists(self, s, project)
            if name is None:
                self.send({"items": self.store.list_for(s, project)})
            else:
                self.send(self.store.get(s, project, name))

    def post(self, project, name=None):
        _require(self, "manage_credentials", project)
        data = self.body()
        with self.Session() as s:
            _project_exists(self, s, project)
            out = self._create(s, project, data)
            s.commit()
        log.info("%s %s/%s created by %s", self.what, project, out["name"], self.username)
        self.send(out, 201)

    def delete(self, project, name=None):
        _require(self, "manage_credentials", project)
        with self.Session() as s:
            self.store.delete(s, project, name, self.username)
            s.commit()
        log.info("%s %s/%s deleted by %s", self.what, project, name, self.username)
        self.set_status(204)
        self.finish()


class CredentialsHandler(_ProjectItems):
    store, what = credentials, "credential"

    def _create(self, s, project: str, data: dict) -> dict:
        return credentials.create(s, credentials.vault_for(self.ctx.cfg), project, data, self.username)


class DataSourcesHandler(_ProjectItems):
    store, what = datasources, "data source"


class AuditHandler(ApiHandler):
    def get(self):
        scope = audit_scope(self.who)
        arg = self.get_argument
        with self.Session() as s:
            out = audit.query(s, actor=arg("actor", None), action=arg("action", None),
                              project=arg("project", None), since=arg("since", None),
                              until=arg("until", None), limit=arg("limit", None),
                              offset=arg("offset", None), **scope)
        self.send(out)


def routes(a: str) -> list:
    """Routes under ``a`` (the prefix ending in api/v1)."""
    from tornado.web import url

    n = r"([^/]+)"
    return [
        url(a + f"/projects/{n}/credentials", CredentialsHandler),
        url(a + f"/projects/{n}/credentials/{n}", CredentialsHandler),
        url(a + f"/projects/{n}/datasources", DataSourcesHandler),
        url(a + f"/projects/{n}/datasources/{n}", DataSourcesHandler),
        url(a + "/audit", AuditHandler),
    ]


__all__ = ["routes"]
