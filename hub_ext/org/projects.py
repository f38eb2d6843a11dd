"""The organisation store: departments, projects (quotas, members) and their usage.

Errors: ``FieldError`` (bad value, HTTP 400), ``NotFound`` (404), ``Conflict`` (409).
A department's quota bounds the sum of its projects' quotas, in each node pool. Quotas
in the default pool are the rows' columns; other pools' are in ``pools`` (pool -> the same
fields). Shrinking a project's quota
below what it runs now is allowed: the scheduler reclaims over-quota work.
"""

from __future__ import annotations

from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path

import yaml
from sqlalchemy import delete, func, insert, select

from gpupool.errors import GpupoolError
from scheduler.model import DEFAULT_POOL, MAX_CPU_MEMORY, Department, Project, Quota

from .. import validation
from ..db import audit
from ..db.events import add_event
from ..db.tables import (
    FINISHED,
    DepartmentRow,
    MemberRow,
    NodeRow,
    PolicyRow,
    ProjectRow,
    WorkloadRow,
    bump_version,
)
from ..validation import MAX_GPUS, FieldError
from . import holds, roles


class NotFound(GpupoolError, LookupError):
    pass


class Conflict(GpupoolError, ValueError):
    def __init__(self, field_name: str, message: str):
        super().__init__(f"{field_name}: {message}")
        self.field = field_name
        self.message = message


QUOTA_FIELDS = ("gpus", "over_quota_weight", "limit", "cpu_quota", "memory_quota_gib")
MAX_POOLS = 64  # node pools with a quota of their own, per department or project
# field -> the most it may be (scheduler.model.Quota refuses more)
QUOTA_MAX = {"gpus": MAX_GPUS, "over_quota_weight": validation.MAX_WEIGHT, "limit": MAX_GPUS,
             "cpu_quota": MAX_CPU_MEMORY, "memory_quota_gib": MAX_CPU_MEMORY}
UNITS = {"gpus": " GPUs", "limit": " GPUs", "over_quota_weight": "", "cpu_quota": " CPUs",
         "memory_quota_gib": " GiB"}


def _num(data: dict, key: str, default, allow_none=False):
    v = data.get(key, default)
    if v is None and allow_none:
        return None
    unit = UNITS[key] + (", or null" if allow_none else "")
    return validation.number(v, key, 0, QUOTA_MAX[key], unit=unit)


def _quota_fields(data: dict, current=None) -> dict:
    cur = current or {"gpus": 0.0, "over_quota_weight": 1.0, "limit": None}
    out = {
        "gpus": _num(data, "gpus", cur["gpus"]),
        "over_quota_weight": _num(data, "over_quota_weight", cur["over_quota_weight"]),
        "limit": _num(data, "limit", cur["limit"], allow_none=True),
        # CPU and memory quotas: caps the scheduler holds the work to (Quota.cpu, .memory_gib)
        "cpu_quota": _num(data, "cpu_quota", cur.get("cpu_quota"), allow_none=True),
        "memory_quota_gib": _num(data, "memory_quota_gib", cur.get("memory_quota_gib"), allow_none=True),
    }
    if out["limit"] is not None and out["limit"] < out["gpus"]:
        raise FieldError("limit", f"must be >= the quota ({out['gpus']:g} GPUs) or null")
    return out


def _pool_quotas(data: dict, current: dict | None = None) -> dict:
    """``pools``: node pool -> quota fields (null removes the pool's quota); merged into
    ``current``. Errors name the pool: ``pools.fast.gpus``."""
    out = {k: dict(v) for k, v in (current or {}).items()}
    if "pools" not in data:
        return out
    raw = data["pools"]
    if not isinstance(raw, dict):
        raise FieldError("pools", f"must be an object of node pool -> quota, got {validation.show(raw)}")
    for pool, q in raw.items():
        validation.name(pool, "pools", "name")
        where = f"pools.{pool}"
        if pool == DEFAULT_POOL:
            raise FieldError(where, f"the {DEFAULT_POOL} pool's quota is set by the top-level fields "
                             f"({', '.join(QUOTA_FIELDS)})")
        if q is None:
            out.pop(pool, None)
            continue
        if not isinstance(q, dict):
            raise FieldError(where, f"must be a JSON object of quota fields or null, got {validation.show(q)}")
        with _where(where):
            validation.check_fields(q, QUOTA_FIELDS)
            out[pool] = _quota_fields(q, out.get(pool))
    if len(out) > MAX_POOLS:
        raise FieldError("pools", f"must name at most {MAX_POOLS} node pools, got {len(out)}")
    return out


def _check_name(data: dict, what: str) -> str:
    try:
        return validation.name(data.get("name"), "name")
    except FieldError as e:
        raise FieldError("name", f"a {what} name {e.message}") from None


def _check_unknown(data: dict, allowed: tuple[str, ...]) -> None:
    validation.check_fields(data, allowed)


def _members(data: dict) -> list[str] | None:
    if "members" not in data:
        return None
    m = data["members"]
    if not isinstance(m, list):
        raise FieldError("members", f"must be a list of user names, got {validation.show(m)}")
    return sorted(set(validation.names(m, "members", "user", validation.MAX_MEMBERS, unique=False)))


def _department_name(dept) -> str:
    """A department named in a body: FieldError unless it is a name (the caller checks it exists)."""
    if not validation.is_name(dept):
        raise FieldError("department", f"must name an existing department, got {validation.show(dept)}")
    return dept


# -- reads -------------------------------------------------------------------------------
def dept_dict(d: DepartmentRow, projects: list[str] | None = None) -> dict:
    out = {"name": d.name, "gpus": d.gpus, "over_quota_weight": d.over_quota_weight, "limit": d.limit,
           "cpu_quota": d.cpu_quota, "memory_quota_gib": d.memory_quota_gib, "pools": d.pool_quotas or {}}
    if projects is not None:
        out["projects"] = projects
    return out


def usage(s) -> dict[str, dict]:
    """Per project: GPUs allocated now (running or releasing) and workloads by state."""
    out: dict[str, dict] = defaultdict(lambda: {"allocated_gpus": 0.0, "running": 0, "pending": 0})
    rows = s.execute(select(WorkloadRow.project, WorkloadRow.state, WorkloadRow.placement)).all()
    for project, state, placement in rows:
        u = out[project]
        if state in ("running", "releasing", "stopping"):
            u["running"] += 1
            u["allocated_gpus"] += sum(p["gpu_milli"] * len(p["gpu_indices"]) for p in placement) / 1000
        elif state == "pending":
            u["pending"] += 1
    return out


def capacity_gpus(s) -> int:
    return sum(len(g) for (g,) in s.execute(select(NodeRow.gpus)).all())


def project_dict(p: ProjectRow, members: list[str], use: dict | None = None) -> dict:
    use = use or {"allocated_gpus": 0.0, "running": 0, "pending": 0}
    return {
        "name": p.name,
        "department": p.department,
        "gpus": p.gpus,
        "over_quota_weight": p.over_quota_weight,
        "limit": p.limit,
        "cpu_quota": p.cpu_quota,
        "memory_quota_gib": p.memory_quota_gib,
        "pools": p.pool_quotas or {},
        "members": members,
        "allocated_gpus": round(use["allocated_gpus"], 3),
        "running": use["running"],
        "pending": use["pending"],
    }


def members_by_project(s) -> dict[str, list[str]]:
    out: dict[str, list[str]] = defaultdict(list)
    for project, user in s.execute(select(MemberRow.project, MemberRow.user).order_by(MemberRow.user)):
        out[project].append(user)
    return out


def list_projects(s, only: set[str] | None = None) -> list[dict]:
    members, use = members_by_project(s), usage(s)
    rows = s.scalars(select(ProjectRow).order_by(ProjectRow.name)).all()
    return [
        project_dict(p, members.get(p.name, []), use.get(p.name))
        for p in rows
        if only is None or p.name in only
    ]


def get_project(s, name: str) -> dict:
    p = s.get(ProjectRow, name)
    if p is None:
        raise NotFound(f"project {name!r} does not exist")
    members = list(s.scalars(select(MemberRow.user).where(MemberRow.project == name).order_by(MemberRow.user)))
    return project_dict(p, members, usage(s).get(name))


def projects_of(s, user: str) -> list[str]:
    return list(s.scalars(select(MemberRow.project).where(MemberRow.user == user).order_by(MemberRow.project)))


def list_departments(s) -> list[dict]:
    by_dept: dict[str, list[str]] = defaultdict(list)
    for name, dept in s.execute(select(ProjectRow.name, ProjectRow.department).order_by(ProjectRow.name)):
        by_dept[dept].append(name)
    rows = s.scalars(select(DepartmentRow).order_by(DepartmentRow.name)).all()
    return [dept_dict(d, by_dept.get(d.name, [])) for d in rows]


def get_department(s, name: str) -> dict:
    d = s.get(DepartmentRow, name)
    if d is None:
        raise NotFound(f"department {name!r} does not exist")
    projects = list(s.scalars(select(ProjectRow.name).where(ProjectRow.department == name)))
    return dept_dict(d, sorted(projects))


# -- writes ------------------------------------------------------------------------------
def _projects_sum(s, dept: str, skip: str | None = None) -> float:
    q = select(func.coalesce(func.sum(ProjectRow.gpus), 0.0)).where(ProjectRow.department == dept)
    if skip:
        q = q.where(ProjectRow.name != skip)
    return float(s.scalar(q))


def _projects_pool_sums(s, dept: str, skip: str | None = None) -> dict[str, float]:
    """Per node pool other than the default: the sum of the department's project quotas."""
    out: dict[str, float] = defaultdict(float)
    q = select(ProjectRow.pool_quotas).where(ProjectRow.department == dept)
    if skip:
        q = q.where(ProjectRow.name != skip)
    for (pools,) in s.execute(q):
        for pool, quota in (pools or {}).items():
            out[pool] += quota["gpus"]
    return out


def _pool_gpus(pools: dict, pool: str) -> float:
    return (pools.get(pool) or {}).get("gpus", 0.0)


def create_department(s, data: dict, actor: str = audit.SYSTEM) -> dict:
    _check_unknown(data, ("name", "pools", *QUOTA_FIELDS))
    name = _check_name(data, "department")
    if s.get(DepartmentRow, name) is not None:
        raise Conflict("name", f"department {name!r} already exists")
    q = _quota_fields(data)
    pools = _pool_quotas(data)
    s.add(DepartmentRow(name=name, **q, pool_quotas=pools))
    add_event(s, "org", f"department {name} created")
    audit.record(s, actor, "department.created", name, {**q, "pools": pools})
    bump_version(s)
    s.flush()
    return get_department(s, name)


def update_department(s, name: str, data: dict, actor: str = audit.SYSTEM) -> dict:
    _check_unknown(data, (*QUOTA_FIELDS, "pools"))
    d = s.get(DepartmentRow, name)
    if d is None:
        raise NotFound(f"department {name!r} does not exist")
    q = _quota_fields(data, dept_dict(d))
    used = _projects_sum(s, name)
    if q["gpus"] + 1e-9 < used:
        raise FieldError("gpus", f"must be >= {used:g}, the sum of the department's project quotas")
    pools = _pool_quotas(data, d.pool_quotas)
    for pool, held in sorted(_projects_pool_sums(s, name).items()):
        if _pool_gpus(pools, pool) + 1e-9 < held:
            raise FieldError(f"pools.{pool}.gpus", f"must be >= {held:g}, the sum of the department's "
                             f"project quotas in node pool {pool}")
    before = dept_dict(d)
    for k, v in q.items():
        setattr(d, k, v)
    d.pool_quotas = pools
    add_event(s, "org", f"department {name} quota {q['gpus']:g} GPUs")
    audit.record(s, actor, "department.updated", name,
                 {k: [before[k], v] for k, v in {**q, "pools": pools}.items() if before[k] != v})
    bump_version(s)
    return get_department(s, name)


def delete_department(s, name: str, actor: str = audit.SYSTEM) -> None:
    if s.get(DepartmentRow, name) is None:
        raise NotFound(f"department {name!r} does not exist")
    if s.scalar(select(func.count()).select_from(ProjectRow).where(ProjectRow.department == name)):
        raise Conflict("name", f"department {name!r} still has projects; delete them first")
    s.execute(delete(DepartmentRow).where(DepartmentRow.name == name))
    s.execute(delete(PolicyRow).where(PolicyRow.scope == "department", PolicyRow.name == name))
    add_event(s, "org", f"department {name} deleted")
    audit.record(s, actor, "department.deleted", name)
    bump_version(s)


def _check_dept_room(s, dept: str, gpus: float, skip: str | None = None,
                     pools: dict | None = None) -> None:
    d = s.get(DepartmentRow, dept)
    if d is None:
        raise FieldError("department", f"department {dept!r} does not exist")
    room = d.gpus - _projects_sum(s, dept, skip)
    if gpus > room + 1e-9:
        raise FieldError(
            "gpus",
            f"must be from 0 to {max(room, 0):g}: department {dept!r} has a quota of "
            f"{d.gpus:g} GPUs and its other projects hold {d.gpus - room:g}",
        )
    held = _projects_pool_sums(s, dept, skip)
    for pool, quota in sorted((pools or {}).items()):
        has = _pool_gpus(d.pool_quotas or {}, pool)
        room = has - held.get(pool, 0.0)
        if quota["gpus"] > room + 1e-9:
            raise FieldError(
                f"pools.{pool}.gpus",
                f"must be from 0 to {max(room, 0):g}: department {dept!r} has a quota of "
                f"{has:g} GPUs in node pool {pool} and its other projects hold {held.get(pool, 0.0):g}",
            )


def _set_members(s, project: str, members: list[str], had: set[str] | None = None) -> None:
    """Write only the difference, as bulk statements: ORM objects for 100,000 members took
    20 s, and the write lock is held all that time."""
    if had is None:
        had = set(s.scalars(select(MemberRow.user).where(MemberRow.project == project)))
    gone, new = had - set(members), set(members) - had
    table = MemberRow.__table__
    for batch in _batches(sorted(gone)):  # SQLite limits the variables of one statement
        s.execute(delete(table).where(table.c.project == project, table.c.user.in_(batch)))
    if new:
        s.execute(insert(table), [{"project": project, "user": u} for u in sorted(new)])


def _batches(items: list, size: int = 500):
    for i in range(0, len(items), size):
        yield items[i : i + size]


def create_project(s, data: dict, actor: str = audit.SYSTEM) -> dict:
    _check_unknown(data, ("name", "department", "members", "pools", *QUOTA_FIELDS))
    name = _check_name(data, "project")
    if s.get(ProjectRow, name) is not None:
        raise Conflict("name", f"project {name!r} already exists")
    dept = _department_name(data.get("department"))
    q = _quota_fields(data)
    pools = _pool_quotas(data)
    _check_dept_room(s, dept, q["gpus"], pools=pools)
    members = _members(data) or []
    s.add(ProjectRow(name=name, department=dept, **q, pool_quotas=pools))
    s.flush()
    _set_members(s, name, members)
    add_event(s, "org", f"project {name} created with {q['gpus']:g} GPUs", project=name)
    audit.record(s, actor, "project.created", name, {"department": dept, **q, "pools": pools,
                                                            "members": members}, name)
    bump_version(s)
    s.flush()
    return get_project(s, name)


def update_project(s, name: str, data: dict, actor: str = audit.SYSTEM) -> dict:
    _check_unknown(data, ("department", "members", "pools", *QUOTA_FIELDS))
    p = s.get(ProjectRow, name)
    if p is None:
        raise NotFound(f"project {name!r} does not exist")
    q = _quota_fields(data, {k: getattr(p, k) for k in QUOTA_FIELDS})
    pools = _pool_quotas(data, p.pool_quotas)
    dept = _department_name(data.get("department", p.department))
    _check_dept_room(s, dept, q["gpus"], skip=name, pools=pools)
    old = p.gpus
    before = {"department": p.department, **{k: getattr(p, k) for k in QUOTA_FIELDS},
              "pools": p.pool_quotas or {}}
    p.department = dept
    for k, v in q.items():
        setattr(p, k, v)
    p.pool_quotas = pools
    changed = {k: [before[k], v] for k, v in {"department": dept, **q, "pools": pools}.items()
               if before[k] != v}
    if changed:
        audit.record(s, actor, "project.quota", name, changed, name)
    members = _members(data)
    if members is not None:
        had = set(s.scalars(select(MemberRow.user).where(MemberRow.project == name)))
        if had != set(members):
            audit.record(s, actor, "project.members", name, {
                "added": sorted(set(members) - had), "removed": sorted(had - set(members))}, name)
        _set_members(s, name, members, had)
    if old != q["gpus"]:
        add_event(s, "quota", f"project {name} quota {old:g} -> {q['gpus']:g} GPUs", project=name)
    bump_version(s)
    s.flush()
    return get_project(s, name)


def delete_project(s, name: str, actor: str = audit.SYSTEM) -> None:
    if s.get(ProjectRow, name) is None:
        raise NotFound(f"project {name!r} does not exist")
    # Refused while any of its work is unfinished: it may hold GPUs (a process still
    # exiting) or get them again (a suspended training), and its project must outlive it.
    active = s.execute(
        select(WorkloadRow.name, WorkloadRow.state).where(
            WorkloadRow.project == name, WorkloadRow.state.notin_(FINISHED)
        ).order_by(WorkloadRow.name)
    ).all()
    if active:
        listed = ", ".join(f"{w} ({state})" for w, state in active[:5])
        more = f" and {len(active) - 5} more" if len(active) > 5 else ""
        raise Conflict("name", f"project {name!r} has {len(active)} unfinished workloads: "
                       f"{listed}{more}; stop or delete them first")
    for what, names in holds.holding(s, name):
        raise Conflict("name", f"project {name!r} has {len(names)} {what}: "
                       f"{', '.join(names[:5])}; delete them first")
    s.execute(delete(MemberRow).where(MemberRow.project == name))
    s.execute(delete(ProjectRow).where(ProjectRow.name == name))
    s.execute(delete(PolicyRow).where(PolicyRow.scope == "project", PolicyRow.name == name))
    add_event(s, "org", f"project {name} deleted", project=name)
    audit.record(s, actor, "project.deleted", name, project=name)
    bump_version(s)


# -- scheduler model ---------------------------------------------------------------------
def _model_quotas(row) -> dict[str, Quota]:
    """The scheduler's quotas of a department or project row, per node pool."""
    def quota(q: dict) -> Quota:
        return Quota(q["gpus"], q["over_quota_weight"], q["limit"], q.get("cpu_quota"), q.get("memory_quota_gib"))
    own = {k: getattr(row, k) for k in QUOTA_FIELDS}
    return {DEFAULT_POOL: quota(own), **{pool: quota(q) for pool, q in (row.pool_quotas or {}).items()}}


def model_departments(s) -> list[Department]:
    return [Department(d.name, _model_quotas(d)) for d in s.scalars(select(DepartmentRow))]


def model_projects(s) -> list[Project]:
    return [Project(p.name, p.department, _model_quotas(p)) for p in s.scalars(select(ProjectRow))]


# -- starter organisation ----------------------------------------------------------------
def load_starter(s, path: str | Path) -> dict:
    """Load the YAML organisation when the database has no department yet. Returns the
    file's content (the hub also takes its users and admins from it)."""
    data = check_org_file(yaml.safe_load(Path(path).read_text()) or {})
    if s.scalar(select(func.count()).select_from(DepartmentRow)):
        return data
    for i, d in enumerate(data.get("departments", [])):
        d = dict(d)
        projects = d.pop("projects", [])
        people = {roles.DEPARTMENT_ADMIN: d.pop("admins", []), roles.VIEWER: d.pop("viewers", [])}
        with _where(f"departments[{i}]"):
            create_department(s, d)
        for j, p in enumerate(projects):
            with _where(f"departments[{i}].projects[{j}]"):
                create_project(s, {**p, "department": d["name"]})
        for role, users in people.items():
            for u in users:
                roles.set_assignments(s, u, [(role, d["name"])], "org", only_departments={d["name"]})
    for u in data.get("viewers", []):  # viewers of every department
        roles.set_assignments(s, u, [(roles.VIEWER, roles.ALL_DEPARTMENTS)], "org",
                              only_departments={roles.ALL_DEPARTMENTS})
    s.commit()
    return data


@contextmanager
def _where(prefix: str):
    """FieldErrors inside name the org file's entry: ``departments[0].projects[1].gpus``."""
    try:
        yield
    except FieldError as e:
        raise FieldError(f"{prefix}.{e.field}", e.message) from None


def _list_of(raw, field: str, kind: str = "") -> list:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise FieldError(field, f"must be a list, got {validation.show(raw)}")
    if kind:
        validation.names(raw, field, kind, most=validation.MAX_MEMBERS, unique=False)
    return raw


def check_org_file(data) -> dict:
    """The org file's shape and every user name in it (the validation layer's rules);
    departments and projects are checked as they are created. FieldError names the entry."""
    validation.check_fields(data, ("admins", "users", "viewers", "departments"))
    for key in ("admins", "users", "viewers"):
        _list_of(data.get(key), key, "user")
    for i, d in enumerate(_list_of(data.get("departments"), "departments")):
        where = f"departments[{i}]"
        with _where(where):
            validation.check_fields(d, ("name", "admins", "viewers", "projects", "pools", *QUOTA_FIELDS))
            for key in ("admins", "viewers"):
                _list_of(d.get(key), key, "user")
        for j, p in enumerate(_list_of(d.get("projects"), f"{where}.projects")):
            with _where(f"{where}.projects[{j}]"):
                validation.check_fields(p, ("name", "members", "pools", *QUOTA_FIELDS))
    return data


def org_users(data: dict) -> tuple[set[str], set[str]]:
    """(all users, admins) named in a starter organisation file."""
    admins = set(data.get("admins", []))
    users = set(admins) | set(data.get("users", [])) | set(data.get("viewers", []))
    for d in data.get("departments", []):
        users |= set(d.get("admins", [])) | set(d.get("viewers", []))
        for p in d.get("projects", []):
            users |= set(p.get("members", []))
    return users, admins
