"""Inference services in gpupool's database, beside the hub's tables.

The service process (REST API) writes and deletes rows; the hub process (controller and
activator) reads them every ``poll_s`` and writes back ``status`` (replicas, their states
and pending reasons, the autoscaler's last decision) for ``describe``.
"""

from __future__ import annotations

import re
import time

from sqlalchemy import JSON, Float, select
from sqlalchemy.orm import Mapped, mapped_column

from hub_ext.db.tables import Base, Submitted, WorkloadRow
from hub_ext.org.holds import project_holds

REPLICA = re.compile(r"^(.+)-[0-9a-f]{6}$")  # a replica's name: SERVICE-hex (controller.py)


class InferenceRow(Submitted, Base):  # spec: ServiceSpec.to_dict()
    __tablename__ = "inference_services"
    created: Mapped[float] = mapped_column(Float, default=time.time)
    status: Mapped[dict] = mapped_column(JSON, default=dict)  # Service.status()


@project_holds
def project_services(s, project: str) -> tuple[str, list[str]]:
    """A project's inference services keep it: scaled to zero they run nothing, but a
    request would start one."""
    return "inference services", list(s.scalars(
        select(InferenceRow.name).where(InferenceRow.project == project).order_by(InferenceRow.name)))


def replica_rows(s) -> dict[str, WorkloadRow]:
    """The workload rows of the services' replicas (kind inference, named SERVICE-hex)."""
    services = set(s.scalars(select(InferenceRow.name)).all())
    rows = s.scalars(select(WorkloadRow).where(WorkloadRow.kind == "inference")).all()
    return {r.name: r for r in rows if (m := REPLICA.match(r.name)) and m.group(1) in services}


__all__ = ["REPLICA", "InferenceRow", "project_services", "replica_rows"]
