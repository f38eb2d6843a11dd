"""Who may do what: gpupool's four roles and the one rule that every REST endpoint, admin
page and (through the REST API) CLI command asks.

Roles
    platform-admin    everything. The JupyterHub scope ``custom:gpupool:admin`` (role
                      ``gpupool-admin``: the org file's ``admins``, an OIDC group mapped to it).
    department-admin  projects, their quotas (within the department's quota, which org.py
                      enforces), members, credentials and workloads inside one department.
                      Scope ``custom:gpupool:department-admin`` (role gpupool-department-admin).
    member            start and submit in their projects, see their projects' workloads,
                      stop their own. Scope ``custom:gpupool:use`` (every user's ``user`` role).
    viewer            read-only over one department, or over everything (department "*").
                      Scope ``custom:gpupool:view`` (role gpupool-viewer).

JupyterHub roles carry the scopes (what kind of permission); gpupool's ``role_assignments``
table says where a department admin or a viewer holds it (JupyterHub scopes cannot be
filtered by a department). Project membership is the ``members`` table.

Use::

    who = roles.who_for(session, hub_user_model)          # once per request
    d = roles.allowed(who, "manage_project", project="nlp", department="research")
    if not d: raise web.HTTPError(403, d.reason)            # or roles.check(...) -> Forbidden
    roles.visible_projects(session, who)                    # None = every project

Actions are the names in ``ACTIONS``; an unknown action is an error (never a silent allow).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy import String, delete, select
from sqlalchemy.orm import Mapped, mapped_column

from gpupool.errors import GpupoolError

from ..db import audit
from ..db.tables import Base, DepartmentRow, MemberRow, ProjectRow, get_meta
from ..validation import FieldError

ADMIN_SCOPE = "custom:gpupool:admin"
DEPT_ADMIN_SCOPE = "custom:gpupool:department-admin"
USE_SCOPE = "custom:gpupool:use"
VIEW_SCOPE = "custom:gpupool:view"
INFERENCE_AUTH_SCOPE = "custom:gpupool:inference-auth"

PLATFORM_ADMIN, DEPARTMENT_ADMIN, MEMBER, VIEWER = "platform-admin", "department-admin", "member", "viewer"
ROLES = (PLATFORM_ADMIN, DEPARTMENT_ADMIN, MEMBER, VIEWER)
ASSIGNABLE = (DEPARTMENT_ADMIN, VIEWER)  # stored in role_assignments (the others: hub / members)
ALL_DEPARTMENTS = "*"  # a viewer of everything



class RoleRow(Base):
    """A department admin or a viewer, and where from (org file, REST API, OIDC login)."""

    __tablename__ = "role_assignments"
    user: Mapped[str] = mapped_column(String(255), primary_key=True, index=True)
    role: Mapped[str] = mapped_column(String(32), primary_key=True)
    department: Mapped[str] = mapped_column(String(63), primary_key=True)  # "*": every department
    source: Mapped[str] = mapped_column(String(16), default="api")  # org | api | oidc


# JupyterHub custom scopes (c.JupyterHub.custom_scopes) and the hub roles that carry them.
SCOPES = {
    ADMIN_SCOPE: {"description": "Platform admin: manage gpupool's organisation (departments, "
                  "projects, quotas, members, roles); see and stop every workload."},
    DEPT_ADMIN_SCOPE: {"description": "Department admin: manage the projects, quotas, members and "
                       "credentials of the departments gpupool assigns to you."},
    USE_SCOPE: {"description": "See your own projects and run workloads in them."},
    VIEW_SCOPE: {"description": "Read-only view of the departments gpupool assigns to you."},
    INFERENCE_AUTH_SCOPE: {"description": "Ask who holds a token and their projects (the chart's "
                           "inference activator, deciding who may call a service)."},
}
# what a person's token carries (the activator's alone is not one of these)
USER_SCOPES = frozenset(SCOPES) - {INFERENCE_AUTH_SCOPE}
USER_ROLE = {"name": "user", "description": "Standard user privileges",  # every user
             "scopes": ["self", "access:services!service=gpupool", USE_SCOPE]}
HUB_ROLES = {
    PLATFORM_ADMIN: {"name": "gpupool-admin", "scopes": sorted(USER_SCOPES),
                     "description": "gpupool platform admin"},
    DEPARTMENT_ADMIN: {"name": "gpupool-department-admin", "scopes": [DEPT_ADMIN_SCOPE, USE_SCOPE],
                       "description": "gpupool department admin"},
    VIEWER: {"name": "gpupool-viewer", "scopes": [VIEW_SCOPE, USE_SCOPE],
             "description": "gpupool viewer (read-only)"},
}

# The chart's activator (hub_ext.serving.auth.HubApiAuth): the gpupool service's API, and there
# only the callers' look-up (api.inference.CallersHandler).
ACTIVATOR_ROLE = {"name": "gpupool-activator", "services": ["gpupool-activator"],
                  "scopes": ["access:services!service=gpupool", INFERENCE_AUTH_SCOPE],
                  "description": "gpupool's inference activator: who may call a service"}

# action -> what it covers (the REST/page/CLI tables name these). Keep the rule in _RULES.
ACTIONS = {
    "view": "read a project or department and the workloads, events and usage in it",
    "view_cluster": "read cluster-wide figures (nodes, GPU samples); other projects stay anonymous",
    "submit": "start a workspace, submit a training or an inference service in a project",
    "submit_for_others": "submit a workload that another user owns",
    "call_inference": "send requests to a project's inference service (behind the activator)",
    "manage_workload": "stop, delete, suspend or resume a workload (its owner may too)",
    "read_workspace_log": "read a workspace's log, which holds its URLs and kernels' output (its owner may too)",
    "manage_project": "create, change (quota, members) or delete a project",
    "manage_department": "create, change (quota) or delete a department",
    "manage_credentials": "create, change or delete a project's credentials and data sources",
    "use_credentials": "list a project's credentials and data sources, attach them to a workload",
    "manage_roles": "assign or remove department admins and viewers",
    "view_audit": "read the audit log",
    "administer_platform": "anything only a platform admin may do (cluster-wide settings and accounting)",
}


@dataclass(frozen=True)
class Who:
    """A caller as the rule sees them."""

    name: str
    platform_admin: bool = False
    projects: frozenset[str] = frozenset()  # member of
    admin_of: frozenset[str] = frozenset()  # department admin of
    viewer_of: frozenset[str] = frozenset()  # viewer of ("*": all departments)
    # project -> department, for the projects the rule may be asked about
    departments: dict[str, str] = field(default_factory=dict, compare=False)

    def department_of(self, project: str | None) -> str | None:
        return self.departments.get(project) if project else None

    @property
    def roles(self) -> list[str]:
        out = [PLATFORM_ADMIN] if self.platform_admin else []
        out += [DEPARTMENT_ADMIN] if self.admin_of else []
        out += [MEMBER] if self.projects else []
        out += [VIEWER] if self.viewer_of else []
        return out


class Decision:
    """Truthy when allowed; ``reason`` says why not (for the 403 body)."""

    __slots__ = ("ok", "reason")

    def __init__(self, ok: bool, reason: str = ""):
        self.ok, self.reason = ok, reason

    def __bool__(self) -> bool:
        return self.ok

    def __repr__(self) -> str:
        return f"Decision({self.ok}, {self.reason!r})"


class Forbidden(GpupoolError, PermissionError):
    """Raised by ``check``; the service answers 403 with ``reason``."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


_YES = Decision(True)


def _dept_admin(who: Who, dept: str | None) -> bool:
    return dept is not None and dept in who.admin_of


def _viewer(who: Who, dept: str | None) -> bool:
    return ALL_DEPARTMENTS in who.viewer_of or (dept is not None and dept in who.viewer_of)


def allowed(who: Who, action: str, project: str | None = None, department: str | None = None,
            owner: str | None = None) -> Decision:
    """May ``who`` do ``action`` on ``project`` (or ``department``)? ``owner``: the workload's
    owner for ``manage_workload``. ``department`` defaults to the project's department."""
    if action not in ACTIONS:
        raise ValueError(f"unknown action {action!r}; known: {', '.join(ACTIONS)}")
    if who.platform_admin:
        return _YES
    dept = department if department is not None else who.department_of(project)
    where = f"project {project!r}" if project else f"department {department!r}" if department else "gpupool"
    member = project is not None and project in who.projects
    if action == "view":
        if member or _dept_admin(who, dept) or _viewer(who, dept):
            return _YES
        if project is None and department is not None and department in set(who.departments.get(p)
                                                                             for p in who.projects):
            return _YES  # a member sees the department their project belongs to
        return Decision(False, f"{who.name} is not a member, department admin or viewer of {where}")
    if action == "view_cluster":
        return _YES  # every gpupool user; callers hide other projects' names (visible_projects)
    if action == "use_credentials" and _dept_admin(who, dept):
        return _YES  # who manages a project's credentials may also list and attach them
    if action in ("submit", "use_credentials", "call_inference"):
        if member:
            return _YES
        extra = " (viewers are read-only)" if _viewer(who, dept) else ""
        return Decision(False, f"{who.name} is not a member of {where}{extra}")
    if action in ("manage_workload", "read_workspace_log"):
        if (owner is not None and owner == who.name and member) or _dept_admin(who, dept):
            return _YES
        what = "change it" if action == "manage_workload" else "read its log"
        thing = "workload" if action == "manage_workload" else "workspace"
        return Decision(False, f"only the {thing}'s owner, an admin of its department or a platform "
                        f"admin can {what} ({where})")
    if action == "view_audit" and project is None and department is None and who.admin_of:
        return _YES  # the log filtered to their departments (governance_api.audit_scope)
    if action in ("manage_project", "manage_credentials", "manage_roles", "view_audit"):
        if _dept_admin(who, dept):
            return _YES
        of = f"department {dept!r}" if dept else "the department"
        return Decision(False, f"{who.name} may not {action.replace('_', ' ')} here: this needs a "
                        f"department admin of {of} or a platform admin ({ADMIN_SCOPE})")
    if action == "administer_platform":
        return Decision(False, f"this needs a platform admin ({ADMIN_SCOPE}); {who.name} is not one")
    if action == "submit_for_others":
        return Decision(False, f"only platform admins ({ADMIN_SCOPE}) can submit for another user")
    if action == "manage_department":
        return Decision(False, f"only platform admins ({ADMIN_SCOPE}) can create, change or delete "
                        "departments")
    raise AssertionError(action)  # every action has a branch above


def check(who: Who, action: str, project: str | None = None, department: str | None = None,
          owner: str | None = None) -> None:
    d = allowed(who, action, project, department, owner)
    if not d:
        raise Forbidden(d.reason)


# -- building a Who ----------------------------------------------------------------------
def who_for(s, user: dict | None) -> Who:
    """The caller from a JupyterHub user model (``name``, ``scopes``, ``admin``) and gpupool's
    tables (memberships, role assignments)."""
    user = user or {}
    name = user.get("name", "")
    scopes = set(user.get("scopes", []))
    admin_of, viewer_of = set(), set()
    for role, dept in s.execute(select(RoleRow.role, RoleRow.department).where(RoleRow.user == name)):
        (admin_of if role == DEPARTMENT_ADMIN else viewer_of).add(dept)
    return Who(
        name=name,
        platform_admin=ADMIN_SCOPE in scopes,
        projects=frozenset(s.scalars(select(MemberRow.project).where(MemberRow.user == name))),
        admin_of=frozenset(admin_of),
        viewer_of=frozenset(viewer_of),
        departments=_project_departments(s),
    )


_departments_cache: dict[int, tuple[str, dict[str, str]]] = {}


def _project_departments(s) -> dict[str, str]:
    """project -> department, read again only when the organisation's version moved (every
    project write bumps it: org.create/update/delete_project); shared, never mutated."""
    version = get_meta(s, "version", "0")
    key = id(s.get_bind())
    hit = _departments_cache.get(key)
    if hit is None or hit[0] != version:
        hit = (version, dict(s.execute(select(ProjectRow.name, ProjectRow.department)).all()))
        _departments_cache[key] = hit
    return hit[1]


def submit_projects(who: Who) -> list[str]:
    """Projects ``who`` may submit to (the spawn form's and the request rules' list)."""
    return sorted(p for p in who.departments if allowed(who, "submit", project=p))


def visible_projects(who: Who) -> set[str] | None:
    """Projects whose items ``who`` may list; None = every project."""
    if who.platform_admin or ALL_DEPARTMENTS in who.viewer_of:
        return None
    depts = who.admin_of | who.viewer_of
    return set(who.projects) | {p for p, d in who.departments.items() if d in depts}


def visible_departments(who: Who) -> set[str] | None:
    """Departments ``who`` may see; None = every department."""
    mine = visible_projects(who)
    if mine is None:
        return None
    return set(who.admin_of | who.viewer_of) | {who.departments[p] for p in mine if p in who.departments}


# -- assignments (org file, REST, OIDC group mapping) -------------------------------------
def _check_assignment(role: str, department: str) -> None:
    if role not in ASSIGNABLE:
        raise FieldError("role", f"must be one of {', '.join(ASSIGNABLE)} (platform admins come from "
                         "the org file's admins or an OIDC group; members from a project's members)")
    if not isinstance(department, str) or not department:
        raise FieldError("department", "must name a department")
    if department == ALL_DEPARTMENTS and role != VIEWER:
        raise FieldError("department", f"'{ALL_DEPARTMENTS}' (every department) is only for viewers")


def assignments(s, user: str | None = None, departments: set[str] | None = None) -> list[dict]:
    q = select(RoleRow).order_by(RoleRow.user, RoleRow.role, RoleRow.department)
    if user is not None:
        q = q.where(RoleRow.user == user)
    return [{"user": r.user, "role": r.role, "department": r.department, "source": r.source}
            for r in s.scalars(q) if departments is None or r.department in departments]


def set_assignments(s, user: str, wanted: list[tuple[str, str]], source: str,
                    only_departments: set[str] | None = None, replace_all: bool = False,
                    actor: str = "") -> None:
    """Make ``user``'s assignments from ``source`` exactly ``wanted`` [(role, department)],
    touching only ``only_departments`` when given (a department admin's reach).
    ``replace_all``: drop the user's assignments from every source first (the REST API).
    Each change is audited (role.granted / role.revoked) as ``actor``: the admin who asked;
    default: the user at an OIDC login, "system" for the org file."""
    for role, dept in wanted:
        _check_assignment(role, dept)
        if dept != ALL_DEPARTMENTS and s.get(DepartmentRow, dept) is None:
            raise FieldError("department", f"department {dept!r} does not exist")
        if only_departments is not None and dept not in only_departments:
            raise Forbidden(f"you can assign roles only in your departments ({', '.join(sorted(only_departments))})")
    q = delete(RoleRow).where(RoleRow.user == user)
    if not replace_all:
        q = q.where(RoleRow.source == source)
    if only_departments is not None:
        q = q.where(RoleRow.department.in_(only_departments))
    mine = select(RoleRow.role, RoleRow.department).where(RoleRow.user == user)
    before = set(s.execute(mine).all())
    s.execute(q)
    for role, dept in sorted(set(wanted)):
        if s.get(RoleRow, (user, role, dept)) is None:
            s.add(RoleRow(user=user, role=role, department=dept, source=source))
    s.flush()
    after = set(s.execute(mine).all())
    audit.record_roles(s, actor or (user if source == "oidc" else audit.SYSTEM), user, before, after)


def hub_roles_for(who: Who) -> list[dict]:
    """JupyterHub role specs for ``who`` (Authenticator.manage_roles): ``user`` plus gpupool's."""
    out = [dict(USER_ROLE)]
    for role in who.roles:
        if role in HUB_ROLES:
            out.append(dict(HUB_ROLES[role]))
    return out


__all__ = [
    "ACTIONS", "ACTIVATOR_ROLE", "ADMIN_SCOPE", "ALL_DEPARTMENTS", "ASSIGNABLE", "DEPARTMENT_ADMIN",
    "DEPT_ADMIN_SCOPE", "INFERENCE_AUTH_SCOPE", "USER_SCOPES",
    "Decision", "Forbidden", "HUB_ROLES", "USER_ROLE", "MEMBER", "PLATFORM_ADMIN", "ROLES", "RoleRow", "SCOPES", "USE_SCOPE",
    "VIEWER", "VIEW_SCOPE", "Who", "allowed", "assignments", "check", "hub_roles_for",
    "set_assignments", "submit_projects", "visible_departments", "visible_projects", "who_for",
]
