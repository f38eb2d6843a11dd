"""What the hub's home page shows beside JupyterHub's server list (templates/hub/home.html):
the user's workspaces and jobs with project, GPU share and state, and the quota use of
their projects. Given to the template through ``JupyterHub.template_vars``."""

from __future__ import annotations

import logging
from urllib.parse import quote

from sqlalchemy import select

from .. import humanize
from ..db.tables import FINISHED, WorkloadRow

log = logging.getLogger("gpupool.home")
RECENT = 20  # finished workloads listed under the live ones


def asked(spec: dict) -> str:
    """What a request asks for, as the home page and the queue say it."""
    mode = spec.get("gpu_mode")
    if mode == "fraction":
        return humanize.gpus(round(float(spec.get("gpu_fraction") or 0) * 1000))
    if mode == "whole":
        return humanize.gpus(int(spec.get("gpus") or 0) * 1000)
    if mode == "memory":
        return f"{humanize.gib(spec.get('gpu_memory_gib'))} of GPU memory"
    return "no GPU"


def workload_view(w: WorkloadRow) -> dict:
    placed = sum(p["gpu_milli"] * len(p["gpu_indices"]) for p in w.placement or [])
    return {
        "name": w.name, "kind": w.kind, "project": w.project, "server": w.server, "state": w.state,
        "share": humanize.gpus(placed) if placed else asked(w.spec or {}),
        "where": humanize.placement(w.placement),
        "waiting": humanize.row_waiting(w) if w.state == "pending" else "",
        "since": humanize.when(w.start_time or w.submit_time),
        "finished": w.state in FINISHED,
        # JupyterHub's path of a running workspace (under the hub's public prefix)
        "path": ("user/" + "/".join(quote(p, safe="") for p in (w.owner, w.server) if p) + "/")
        if w.kind == "workspace" and w.state == "running" else "",
    }


def home_context(rt, user) -> dict:
    """The gpupool part of the home page for ``user`` (a JupyterHub User; None when logged
    out). Never raises: the home page shows JupyterHub's part without it."""
    if user is None:
        return {}
    try:
        projects = rt.limits(user.name).projects
        status = rt.project_status(projects)["projects"]
        with rt.Session() as s:
            rows = s.scalars(select(WorkloadRow).where(WorkloadRow.owner == user.name)
                             .order_by(WorkloadRow.submit_time.desc())).all()
            live = [workload_view(w) for w in rows if w.state not in FINISHED]
            done = [workload_view(w) for w in rows if w.state in FINISHED][:RECENT]
        return {
            "workloads": live + done,
            "projects": [{"name": p, **status[p]} for p in projects if p in status],
        }
    except Exception:
        log.exception("the home page's workloads and quotas could not be read")
        return {"error": "gpupool could not read your workloads and quotas; see the hub's log"}
