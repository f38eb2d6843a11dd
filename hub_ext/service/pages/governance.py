"""Credentials and data sources of each project, and the audit log.

``/credentials``: admins create and delete (the page calls the REST API); members see the
names, keys and timestamps of their projects' items. No value is ever rendered: the page
gets ``credential_dict``s, which hold none. ``/audit``: admins only; the same filters and
pages as ``GET /api/v1/audit``.
"""

from __future__ import annotations

import time

from tornado import web

from ... import audit, credentials, datasources, org
from ...requests import FieldError
from . import PageHandler


def _when(ts: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts)) if ts else ""


class CredentialsPage(PageHandler):
    @web.authenticated
    def get(self):
        with self.Session() as s:
            mine = None if self.is_admin else set(org.projects_of(s, self.username))
            projects = [p["name"] for p in org.list_projects(s, mine)]
            rows = [(p, credentials.list_for(s, p), datasources.list_for(s, p)) for p in projects]
        self.render_page("credentials.html", rows=rows, when=_when,
                         deliveries=credentials.DELIVERIES, kinds=list(datasources.KINDS))


class AuditPage(PageHandler):
    @web.authenticated
    def get(self):
        if not self.is_admin:
            raise web.HTTPError(403, "the audit log is for gpupool admins")
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
                                  limit=str(page_size), offset=str(offset))
            except FieldError as e:
                out, error = {"items": [], "total": 0, "limit": page_size, "offset": 0}, str(e)
        self.render_page("audit.html", out=out, filters=filters, error=error, when=_when,
                         actions=audit.ACTIONS, page_size=page_size)


def routes(prefix):
    return [(prefix + r"/credentials", CredentialsPage), (prefix + r"/audit", AuditPage)]
