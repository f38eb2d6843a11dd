"""Which workloads share each GPU, as the nodes page and the nodes API both show it."""

from __future__ import annotations

from sqlalchemy import select

from .. import org
from ..db import NodeRow, WorkloadRow

HOLDING = ("running", "releasing", "stopping")


def gpu_sharing(session, username: str, is_admin: bool):
    """(nodes, {(node, gpu index): [{workload, project, gpu, over_quota}]}); other projects'
    workloads are shown to non-admins without their names."""
    nodes = session.scalars(select(NodeRow).order_by(NodeRow.name)).all()
    running = session.scalars(select(WorkloadRow).where(WorkloadRow.state.in_(HOLDING))).all()
    mine = None if is_admin else set(org.projects_of(session, username))
    share: dict[tuple[str, int], list[dict]] = {}
    for w in running:
        visible = mine is None or w.project in mine
        for p in w.placement:
            for i in p["gpu_indices"]:
                share.setdefault((p["node"], i), []).append({
                    "workload": w.name if visible else "(other project)",
                    "project": w.project if visible else "",
                    "gpu": p["gpu_milli"] / 1000,
                    "over_quota": bool(w.over_quota),
                })
    return nodes, share
