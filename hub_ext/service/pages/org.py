"""Organisation: departments and projects with quotas, weights, limits and members.
Admins edit here (the page calls the REST API); members see their projects read-only."""

from __future__ import annotations

from sqlalchemy import select
from tornado import web

from scheduler.model import DEFAULT_POOL

from ...db.tables import NodeRow
from ...org import roles
from .base import PageHandler


class OrgPage(PageHandler):
    @web.authenticated
    def get(self):
        who = self.who
        with self.Session() as s:
            depts, projects = self.visible_org(s)
            node_pools = set(s.scalars(select(NodeRow.pool).distinct()))
        editable = {p["name"] for p in projects if roles.allowed(who, "manage_project", project=p["name"])}
        creatable = [d["name"] for d in depts if roles.allowed(who, "manage_project", department=d["name"])]
        # pools with nodes, and pools a quota names (its nodes may join later)
        pools = sorted((node_pools | {k for x in depts + projects for k in x["pools"]}) - {DEFAULT_POOL})
        pool_rows = [("departments", d, self.is_admin) for d in depts] + \
            [("projects", p, p["name"] in editable) for p in projects]
        self.render_page("org.html", depts=depts, projects=projects, editable=editable,
                         creatable=creatable, pools=pools, pool_rows=pool_rows, default_pool=DEFAULT_POOL)


def routes(prefix):
    return [(prefix + r"/org", OrgPage)]
