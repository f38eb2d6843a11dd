"""Policies: each department's and project's policy (hub_ext/org/policy.py), edited here by who
may manage them (the page calls the REST API, which audits every change)."""

from __future__ import annotations

import json

from tornado import web

from ...org import policy, roles
from .base import PageHandler


class PoliciesPage(PageHandler):
    @web.authenticated
    def get(self):
        who = self.who
        with self.Session() as s:
            departments, projects = self.visible_org(s)
            depts = [d["name"] for d in departments]
            rows = [("department", d, policy.stored(s, "department", d),
                     roles.allowed(who, "manage_department", department=d)) for d in depts]
            rows += [("project", p["name"], policy.stored(s, "project", p["name"]),
                      roles.allowed(who, "manage_project", project=p["name"])) for p in projects]
        self.render_page("policies.html", rows=[(sc, n, json.dumps(spec, indent=1), bool(m)) for sc, n, spec, m in rows],
                         fields=policy.FIELDS)


def routes(prefix):
    return [(prefix + r"/policies", PoliciesPage)]
