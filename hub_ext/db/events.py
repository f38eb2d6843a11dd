"""The event log's one writer. A workload event (placed, preempted, stopped, deleted,
released) is audited in the same transaction, so the audit entries of workload actions come
from the event path and nothing else has to remember them."""

from __future__ import annotations

from sqlalchemy import select

from .audit import record_event
from .tables import EventRow, ProjectRow, WorkloadRow


def add_event(session, kind: str, message: str, workload: str = "", project: str = "",
              **fields) -> None:
    """Append an event; ``user`` (the workload's owner) and ``department`` (the project's)
    are filled in from the tables unless given, so every writer records them the same way."""
    if "user" not in fields and workload:
        fields["user"] = session.scalar(select(WorkloadRow.owner).where(WorkloadRow.name == workload))
    if "department" not in fields and project:
        fields["department"] = session.scalar(select(ProjectRow.department).where(ProjectRow.name == project))
    actor = fields.pop("actor", "")  # who asked (audit log); the event row does not keep it
    session.add(EventRow(kind=kind, message=message, workload=workload, project=project, **fields))
    record_event(session, kind, workload, project, message, actor)


__all__ = ["add_event"]
