"""Organisation: departments and projects with quotas, weights, limits and members.
Admins edit here (the page calls the REST API); members see their projects read-only."""

from __future__ import annotations

from tornado import web

from ... import org
from . import PageHandler


class OrgPage(PageHandler):
    @web.authenticated
    def get(self):
        with self.Session() as s:
            mine = None if self.is_admin else set(org.projects_of(s, self.username))
            projects = org.list_projects(s, mine)
            depts = org.list_departments(s)
            if mine is not None:
                keep = {p["department"] for p in projects}
                depts = [d for d in depts if d["name"] in keep]
        self.render_page("org.html", depts=depts, projects=projects)


def routes(prefix):
    return [(prefix + r"/org", OrgPage)]
