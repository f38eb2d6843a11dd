"""Credentials and data sources of each project, and the audit log.

``/credentials``: platform admins and the project's department admins create and delete
(the page calls the REST API); members and viewers see the names, keys and timestamps of
the projects they may see. No value is ever rendered: the page
gets ``credential_dict``s, which hold none. ``/audit``: platform admins (all) and department admins (their departments' projects); the same filters and
pages as ``GET /api/v1/audit``.
"""

from __future__ import annotations

from tornado import web

from ... import humanize
from ...api.governance import audit_scope
from ...attachments import credentials, datasources
from ...db import audit
from ...org import projects as org
from ...org import roles
from ...requests.rules import FieldError
from .base import PageHandler


def _when(ts: float | None) -> str:
    return humanize.when(ts) if ts else ""


class CredentialsPage(PageHandler):
    @web.authenticated
    def get(self):
        who = self.who
        with self.Session() as s:
            projects = [p["name"] for p in org.list_projects(s, roles.visible_projects(who))]
            rows = [(p, credentials.list_for(s, p), datasources.list_for(s, p),
                     bool(roles.allowed(who, "manage_credentials", project=p))) for p in projects]
        self.render_page("credentials.html", rows=rows, when=_when,
                         deliveries=credentials.DELIVERIES, kinds=list(datasources.KINDS))


class AuditPage(PageHandler):
    @web.authenticated
    def get(self):
        try:
            scope = audit_scope(self.who)
        except roles.Forbidden as e:
            raise web.HTTPError(403, e.reason) from None
        arg = self.get_argument
        filters = {k: arg(k, "") for k in ("actor", "action", "project", "since", "until")}
        page_size = self.ctx.cfg.admin_page_size
        error = ""
        try:
            offset = max(0, int(arg("offset", "0") or 0))
        except ValueError:
            offset, error = 0, "offset: must be a whole number"
        with self.Session() as s:
            try:
                out = audit.query(s, **{k: v or None for k, v in filters.items()},
                                  limit=str(page_size), offset=str(offset), **scope)
            except FieldError as e:
                out, error = {"items": [], "total": 0, "limit": page_size, "offset": 0}, str(e)
        self.render_page("audit.html", out=out, filters=filters, error=error, when=_when,
                         actions=audit.ACTIONS, page_size=page_size)


def routes(prefix):
    return [(prefix + r"/credentials", CredentialsPage), (prefix + r"/audit", AuditPage)]
