"""REST API v1 of policies (hub_ext.org.policy):

    /departments/{name}/policy   GET the department's policy, PUT replace it
    /projects/{name}/policy      GET the project's policy and its merge with its department's,
                                 PUT replace it (it may only narrow the department's: 400)

A PUT of ``{}`` clears a policy. Department policies need manage_department, project
policies manage_project; reading either needs view. Every PUT is audited (policy.updated).
"""

from __future__ import annotations

from ..org import policy
from ..org import projects as org
from .base import ApiHandler


class DepartmentPolicyHandler(ApiHandler):
    def get(self, name):
        with self.Session() as s:
            org.get_department(s, name)
            self.require("view", department=name)
            self.send(policy.show(s, "department", name))

    def put(self, name):
        with self.Session() as s:
            org.get_department(s, name)
        self.require("manage_department", department=name)
        data = self.body()
        with self.Session() as s:
            out = policy.put(s, "department", name, data, self.username)
            s.commit()
        self.send(out)


class ProjectPolicyHandler(ApiHandler):
    def get(self, name):
        self.require_project("view", name)
        with self.Session() as s:
            self.send(policy.show(s, "project", name))

    def put(self, name):
        self.require_project("manage_project", name)
        data = self.body()
        with self.Session() as s:
            out = policy.put(s, "project", name, data, self.username)
            s.commit()
        self.send(out)


def routes(a: str) -> list:
    n = r"([a-z0-9-]+|[^/]+)"
    return [(a + f"/departments/{n}/policy", DepartmentPolicyHandler),
            (a + f"/projects/{n}/policy", ProjectPolicyHandler)]
