"""gpupool's tables (SQLAlchemy, SQLite by default) and session set-up.

The hub process (spawner + scheduler loop) and the service process (admin panel, REST
API) share this database. The scheduler loop is the only writer of placements; the
service writes the organisation and new or deleted workloads and bumps ``meta.version`` so
the loop sees a change on its next poll.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from sqlalchemy import (
    JSON,
    Boolean,
    Float,
    ForeignKey,
    Integer,
    String,
    Text,
    create_engine,
    event,
    select,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    pass


class Quotas:
    """The quota columns a department and a project both have."""

    gpus: Mapped[float] = mapped_column(Float, default=0.0)
    over_quota_weight: Mapped[float] = mapped_column(Float, default=1.0)
    limit: Mapped[float | None] = mapped_column(Float, nullable=True)
    cpu_quota: Mapped[float | None] = mapped_column(Float, nullable=True)  # CPUs; None: none
    memory_quota_gib: Mapped[float | None] = mapped_column(Float, nullable=True)
    # node pool (not the default) -> its quota fields, as the columns above name them
    pool_quotas: Mapped[dict] = mapped_column(JSON, default=dict, server_default="{}")


class DepartmentRow(Quotas, Base):
    __tablename__ = "departments"
    name: Mapped[str] = mapped_column(String(63), primary_key=True)


class ProjectRow(Quotas, Base):
    __tablename__ = "projects"
    name: Mapped[str] = mapped_column(String(63), primary_key=True)
    department: Mapped[str] = mapped_column(ForeignKey("departments.name"), index=True)


class Submitted:
    """The columns of a feature's submitted object (a training, an inference service): its
    name, who submitted it to which project, and its spec as submitted."""

    # first in the table, before the feature's own columns
    name: Mapped[str] = mapped_column(String(63), primary_key=True, sort_order=-4)
    owner: Mapped[str] = mapped_column(String(255), index=True, sort_order=-3)
    project: Mapped[str] = mapped_column(String(63), index=True, sort_order=-2)
    spec: Mapped[dict] = mapped_column(JSON, default=dict, sort_order=-1)


class MemberRow(Base):
    __tablename__ = "members"
    project: Mapped[str] = mapped_column(
        ForeignKey("projects.name", ondelete="CASCADE"), primary_key=True
    )
    user: Mapped[str] = mapped_column(String(255), primary_key=True, index=True)


class NodeRow(Base):
    __tablename__ = "nodes"
    name: Mapped[str] = mapped_column(String(255), primary_key=True)
    pool: Mapped[str] = mapped_column(String(63), default="default")
    gpus: Mapped[list] = mapped_column(JSON, default=list)  # [{index, model, memory_mib, uuid}]
    cpu_milli: Mapped[int] = mapped_column(Integer, default=0)
    memory_mib: Mapped[int] = mapped_column(Integer, default=0)
    source: Mapped[str] = mapped_column(String(16), default="declared")  # nvml | declared


class PolicyRow(Base):
    """A department's or project's policy (hub_ext.org.policy): a flat JSON object."""

    __tablename__ = "policies"
    scope: Mapped[str] = mapped_column(String(16), primary_key=True)  # department | project
    name: Mapped[str] = mapped_column(String(63), primary_key=True)
    spec: Mapped[dict] = mapped_column(JSON, default=dict)


class WorkloadRow(Base):
    __tablename__ = "workloads"
    name: Mapped[str] = mapped_column(String(255), primary_key=True)
    owner: Mapped[str] = mapped_column(String(255), index=True)
    project: Mapped[str] = mapped_column(String(63), index=True)
    kind: Mapped[str] = mapped_column(String(16))
    spec: Mapped[dict] = mapped_column(JSON, default=dict)  # WorkloadRequest.to_dict()
    # submitted | pending | running | releasing | stopping (asked to stop) | backoff |
    # suspended | failed | succeeded | stopped
    state: Mapped[str] = mapped_column(String(16), default="pending", index=True)
    placement: Mapped[list] = mapped_column(JSON, default=list)  # [{node, gpu_indices, gpu_milli}]
    over_quota: Mapped[bool] = mapped_column(Boolean, default=False)
    reason: Mapped[str] = mapped_column(Text, default="")
    queue_position: Mapped[int] = mapped_column(Integer, default=0)
    submit_time: Mapped[float] = mapped_column(Float, default=time.time)
    start_time: Mapped[float | None] = mapped_column(Float, nullable=True)
    pid: Mapped[int | None] = mapped_column(Integer, nullable=True)
    server: Mapped[str] = mapped_column(String(255), default="")  # JupyterHub server name


# A workload in any other state holds GPUs or may get them again (a suspended or
# backing-off training, one asked to stop that has not exited yet).
FINISHED = ("failed", "succeeded", "stopped")


class EventRow(Base):
    __tablename__ = "events"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    ts: Mapped[float] = mapped_column(Float, default=time.time, index=True)
    kind: Mapped[str] = mapped_column(String(32))  # submitted|placed|preempted|released|...
    workload: Mapped[str] = mapped_column(String(255), default="", index=True)
    project: Mapped[str] = mapped_column(String(63), default="", index=True)
    message: Mapped[str] = mapped_column(Text, default="")
    # Who and what, for accounting (hub_ext/db/accounting.py): the workload's owner and its
    # project's department when the event was written, and on "placed" the GPUs it took.
    user: Mapped[str | None] = mapped_column(String(255), nullable=True, index=True)
    department: Mapped[str | None] = mapped_column(String(63), nullable=True)
    gpus: Mapped[float | None] = mapped_column(Float, nullable=True)
    placement: Mapped[list | None] = mapped_column(JSON, nullable=True)  # [{node, gpu_indices, gpu_milli}]


class SampleRow(Base):
    __tablename__ = "samples"
    ts: Mapped[float] = mapped_column(Float, primary_key=True)
    capacity_milli: Mapped[int] = mapped_column(Integer)
    allocated_milli: Mapped[int] = mapped_column(Integer)
    utilization_pct: Mapped[float | None] = mapped_column(Float, nullable=True)


class GpuSampleRow(Base):
    """Per-GPU utilization (NVML), so accounting can put use beside each allocation."""

    __tablename__ = "gpu_samples"
    ts: Mapped[float] = mapped_column(Float, primary_key=True)
    node: Mapped[str] = mapped_column(String(255), primary_key=True)
    gpu_index: Mapped[int] = mapped_column(Integer, primary_key=True)
    utilization_pct: Mapped[float] = mapped_column(Float)


class MetaRow(Base):
    __tablename__ = "meta"
    key: Mapped[str] = mapped_column(String(63), primary_key=True)
    value: Mapped[str] = mapped_column(Text, default="")


BUSY_TIMEOUT_S = 30


def make_engine(url: str):
    if url.startswith("sqlite:///"):
        Path(url[len("sqlite:///") :]).parent.mkdir(parents=True, exist_ok=True)
    # The hub, its service and the scheduler loop write the same file: a writer waits up to
    # BUSY_TIMEOUT_S for another's transaction (SQLite's busy timeout) instead of failing
    # with "database is locked"; WAL lets readers go on meanwhile.
    engine = create_engine(url, connect_args={"timeout": BUSY_TIMEOUT_S} if url.startswith("sqlite") else {})
    if url.startswith("sqlite"):

        @event.listens_for(engine, "connect")
        def _pragmas(conn, _record):
            cur = conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.close()

    return engine


def get_meta(session, key: str, default: str = "") -> str:
    row = session.get(MetaRow, key)
    return row.value if row else default


def set_meta(session, key: str, value) -> None:
    row = session.get(MetaRow, key)
    text = value if isinstance(value, str) else json.dumps(value)
    if row is None:
        session.add(MetaRow(key=key, value=text))
    else:
        row.value = text


def bump_version(session) -> None:
    """Tell the scheduler loop that the organisation or the workload list changed."""
    set_meta(session, "version", str(int(get_meta(session, "version", "0")) + 1))


def version(session) -> int:
    return int(get_meta(session, "version", "0"))


__all__ = [
    "Base",
    "DepartmentRow",
    "EventRow",
    "FINISHED",
    "GpuSampleRow",
    "MemberRow",
    "MetaRow",
    "NodeRow",
    "ProjectRow",
    "SampleRow",
    "WorkloadRow",
    "bump_version",
    "get_meta",
    "make_engine",
    "select",
    "set_meta",
    "version",
]
