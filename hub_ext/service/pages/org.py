"""Organisation: departments and projects with quotas, weights, limits and members.
Admins edit here (the page calls the REST API); members see their projects read-only."""

from __future__ import annotations

from tornado import web

from ... import org, roles
from .base import PageHandler


class OrgPage(PageHandler):
    @web.authenticated
    def get(self):
        who = self.who
        seen = roles.visible_departments(who)
        with self.Session() as s:
            projects = org.list_projects(s, roles.visible_projects(who))
            depts = [d for d in org.list_departments(s) if seen is None or d["name"] in seen]
        editable = {p["name"] for p in projects if roles.allowed(who, "manage_project", project=p["name"])}
        creatable = [d["name"] for d in depts if roles.allowed(who, "manage_project", department=d["name"])]
        self.render_page("org.html", depts=depts, projects=projects, editable=editable,
                         creatable=creatable)


def routes(prefix):
    return [(prefix + r"/org", OrgPage)]
