"""The audit log: who changed what (quotas, memberships, credentials, data sources, roles)
and which workload actions happened (start, stop, preempt, credential use).

One table, one writer: ``record(session, actor, action, target, details)``; the caller
commits with its own change, so an entry exists exactly when the change does. ``details``
is a small JSON object of names and numbers: never a credential value (credentials.py
passes key names only). Actions are dotted ``<object>.<verb>`` names, listed in ACTIONS.
"""

from __future__ import annotations

import time

from sqlalchemy import JSON, Float, Integer, String, and_, func, or_, select
from sqlalchemy.orm import Mapped, mapped_column

from .. import validation
from ..validation import FieldError
from .tables import Base

# The actions gpupool records, with what each means (the admin page and the API document
# show this list; a test asserts an entry for each kind it exercises).
ACTIONS = {
    "department.created": "a department was created",
    "department.updated": "a department's quota, weight or limit changed",
    "department.deleted": "a department was deleted",
    "project.created": "a project was created (quota and members in details)",
    "project.quota": "a project's quota, weight, limit or department changed",
    "project.members": "a project's members changed (added / removed in details)",
    "project.deleted": "a project was deleted",
    "policy.updated": "a department's or project's policy changed (before / after in details)",
    "credential.created": "a credential was created (key names in details, never values)",
    "credential.deleted": "a credential was deleted",
    "credential.used": "a credential was attached to a workload or delivered to it",
    "datasource.created": "a data source was created",
    "datasource.deleted": "a data source was deleted",
    "datasource.used": "a data source was attached to a workload",
    "role.granted": "a role was granted",
    "role.revoked": "a role was revoked",
    "workload.start": "the scheduler placed a workload (it starts)",
    "workload.stop": "a user or admin asked a workload to stop (or deleted it, or cancelled it while queued)",
    "workload.released": "a workload ended and its GPUs went back to the pool",
    "workload.preempt": "the scheduler evicted a workload (reclaim or preemption)",
    "ssh.login": "a user logged in through the SSH gateway (method, source address in details)",
    "ssh.refused": "an SSH gateway login was refused (bad token or key, or locked out)",
}
SYSTEM = "system"  # actor of changes nobody asked for through the API (starter org, scheduler)
MAX_PAGE = 1000

# The workload events of the event log (events.add_event) that are audited, and as what.
EVENT_ACTIONS = {
    "placed": "workload.start",
    "preempted": "workload.preempt",
    "stopped": "workload.stop",
    "deleted": "workload.stop",
    "cancelled": "workload.stop",  # stopped while it waited in the queue
    "released": "workload.released",
}


class AuditRow(Base):
    __tablename__ = "audit_log"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    ts: Mapped[float] = mapped_column(Float, default=time.time, index=True)
    actor: Mapped[str] = mapped_column(String(255), index=True)
    action: Mapped[str] = mapped_column(String(63), index=True)
    project: Mapped[str] = mapped_column(String(63), default="", index=True)
    target: Mapped[str] = mapped_column(String(255), default="")
    details: Mapped[dict] = mapped_column(JSON, default=dict)


def record(session, actor: str, action: str, target: str, details: dict | None = None,
           project: str = "") -> None:
    """Add one entry to the audit log (the caller commits it with its change)."""
    if action not in ACTIONS:
        raise ValueError(f"unknown audit action {action!r}")
    session.add(AuditRow(ts=time.time(), actor=actor or SYSTEM, action=action,
                         project=project or "", target=target, details=dict(details or {})))


def record_event(session, kind: str, workload: str, project: str, message: str,
                 actor: str = "") -> None:
    """The audited part of the event log: workload start, stop, release and preemption."""
    action = EVENT_ACTIONS.get(kind)
    if action is None or not workload:
        return
    by_scheduler = kind in ("placed", "preempted", "released")
    record(session, actor or ("scheduler" if by_scheduler else SYSTEM), action, workload,
           {"message": message}, project)


def record_roles(session, actor: str, user: str, before: set[tuple[str, str]],
                 after: set[tuple[str, str]]) -> None:
    """role.granted / role.revoked for each (role, department) that differs."""
    for role, dept in sorted(after - before):
        record(session, actor, "role.granted", user, {"role": role, "department": dept})
    for role, dept in sorted(before - after):
        record(session, actor, "role.revoked", user, {"role": role, "department": dept})


def entry_dict(r: AuditRow) -> dict:
    return {"id": r.id, "ts": r.ts, "actor": r.actor, "action": r.action,
            "project": r.project, "target": r.target, "details": r.details or {}}


def _time(raw: str | None, key: str) -> float | None:
    return None if raw in (None, "") else validation.unix_time(raw, key)


def _int(raw: str | None, key: str, default: int, lo: int, hi: int) -> int:
    return validation.integer_arg(raw, key, default, lo, hi)


def query(s, actor: str | None = None, action: str | None = None, project: str | None = None,
          since: str | None = None, until: str | None = None, limit: str | None = None,
          offset: str | None = None, projects: set[str] | None = None,
          departments: set[str] | None = None) -> dict:
    """Entries newest first, filtered, one page: ``{items, total, limit, offset}``.
    Arguments arrive as query-string text and are checked here (FieldError names the
    field). ``action`` may be a prefix ending in '.' (``credential.``). ``projects`` and
    ``departments`` bound what a department admin sees: entries of those projects, and
    department and role changes in those departments."""
    lo, hi = _time(since, "since"), _time(until, "until")
    if lo is not None and hi is not None and hi < lo:
        raise FieldError("until", f"must be >= since ({lo:g}), got {hi:g}")
    n, skip = _int(limit, "limit", 100, 1, MAX_PAGE), _int(offset, "offset", 0, 0, 10**9)
    if action and not action.endswith(".") and action not in ACTIONS:
        raise FieldError("action", f"must be one of {', '.join(ACTIONS)} or a prefix such as "
                         f"'credential.', got {validation.show(action)}")
    conds = []
    if actor:
        conds.append(AuditRow.actor == actor)
    if action:
        conds.append(AuditRow.action.startswith(action) if action.endswith(".")
                     else AuditRow.action == action)
    if project:
        conds.append(AuditRow.project == project)
    if projects is not None:
        depts = sorted(departments or ())
        conds.append(or_(
            AuditRow.project.in_(sorted(projects)),
            and_(AuditRow.action.startswith("department."), AuditRow.target.in_(depts)),
            and_(AuditRow.action.startswith("role."),
                 AuditRow.details["department"].as_string().in_(depts)),
        ))
    if lo is not None:
        conds.append(AuditRow.ts >= lo)
    if hi is not None:
        conds.append(AuditRow.ts <= hi)
    total = s.scalar(select(func.count()).select_from(AuditRow).where(*conds))
    rows = s.scalars(select(AuditRow).where(*conds).order_by(AuditRow.id.desc())
                     .offset(skip).limit(n)).all()
    return {"items": [entry_dict(r) for r in rows], "total": total, "limit": n, "offset": skip}


__all__ = ["ACTIONS", "AuditRow", "EVENT_ACTIONS", "SYSTEM", "entry_dict", "query", "record",
           "record_event", "record_roles"]
