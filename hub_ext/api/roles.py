"""REST API v1 of roles: ``/roles`` (the role table, who you are, the assignments you may
see) and ``/users/{name}/roles`` (read or replace one user's department-admin and viewer
assignments). Who may change what is hub_ext.org.roles' ``manage_roles`` rule: platform admins
anywhere, department admins inside their departments."""

from __future__ import annotations

from .. import validation
from ..org import roles
from ..validation import FieldError
from .base import ApiHandler

ROLE_TABLE = [
    {"role": roles.PLATFORM_ADMIN, "hub_role": roles.HUB_ROLES[roles.PLATFORM_ADMIN]["name"],
     "scopes": roles.HUB_ROLES[roles.PLATFORM_ADMIN]["scopes"], "assigned_by": "org file admins, OIDC group mapping"},
    {"role": roles.DEPARTMENT_ADMIN, "hub_role": roles.HUB_ROLES[roles.DEPARTMENT_ADMIN]["name"],
     "scopes": roles.HUB_ROLES[roles.DEPARTMENT_ADMIN]["scopes"],
     "assigned_by": "org file (department admins), REST API, OIDC group mapping"},
    {"role": roles.MEMBER, "hub_role": "user", "scopes": [roles.USE_SCOPE],
     "assigned_by": "project members (org file, REST API, OIDC group mapping)"},
    {"role": roles.VIEWER, "hub_role": roles.HUB_ROLES[roles.VIEWER]["name"],
     "scopes": roles.HUB_ROLES[roles.VIEWER]["scopes"],
     "assigned_by": "org file (department viewers, top-level viewers), REST API, OIDC group mapping"},
]


def _me(who: roles.Who) -> dict:
    return {"name": who.name, "roles": who.roles, "projects": sorted(who.projects),
            "department_admin_of": sorted(who.admin_of), "viewer_of": sorted(who.viewer_of)}


def _seen(who: roles.Who) -> set[str] | None:
    """Departments whose assignments ``who`` may read (None: all)."""
    if who.platform_admin or roles.ALL_DEPARTMENTS in who.viewer_of:
        return None
    return set(who.admin_of) | set(who.viewer_of)


class RolesHandler(ApiHandler):
    def get(self):
        who = self.who
        with self.Session() as s:
            items = roles.assignments(s, departments=_seen(who))
        self.send({"roles": ROLE_TABLE, "me": _me(who), "items": items})


class UserRolesHandler(ApiHandler):
    def get(self, user):
        who = self.who
        seen = None if user == who.name else _seen(who)
        with self.Session() as s:
            self.send({"user": user, "items": roles.assignments(s, user, departments=seen)})

    def put(self, user):
        validation.name(user, "name", "user")
        data = self.body()
        validation.check_fields(data, {"roles"})
        wanted = data.get("roles")
        if not isinstance(wanted, list) or not all(
                isinstance(r, dict) and set(r) == {"role", "department"} for r in wanted):
            raise FieldError("roles", "must be a list of {role, department} objects")
        if len(wanted) > validation.MAX_ROLES:
            raise FieldError("roles", f"must hold at most {validation.MAX_ROLES} assignments, got {len(wanted)}")
        for r in wanted:
            if not isinstance(r["role"], str) or r["role"] not in roles.ASSIGNABLE:
                raise FieldError("role", f"must be one of {', '.join(roles.ASSIGNABLE)}, "
                                 f"got {validation.show(r['role'])}")
            if r["department"] != roles.ALL_DEPARTMENTS:
                validation.name(r["department"], "department")
        who = self.who
        reach = None if who.platform_admin else set(who.admin_of)
        if reach is not None:
            for r in wanted:
                self.require("manage_roles", department=r["department"])
            if not reach:
                self.require("manage_roles")
        with self.Session() as s:
            roles.set_assignments(s, user, [(r["role"], r["department"]) for r in wanted], "api",
                                  only_departments=reach, replace_all=True, actor=self.username)
            s.commit()
            self.send({"user": user, "items": roles.assignments(s, user, departments=reach)})


def routes(api: str) -> list:
    from tornado.web import url

    return [url(api + "/roles", RolesHandler),
            url(api + r"/users/([^/]+)/roles", UserRolesHandler)]
