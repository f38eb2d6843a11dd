"""Nodes and GPUs: which workloads share each GPU and how much."""

from __future__ import annotations

from sqlalchemy import select
from tornado import web

from ... import org
from ...db import NodeRow, WorkloadRow
from . import PageHandler


class NodesPage(PageHandler):
    @web.authenticated
    def get(self):
        with self.Session() as s:
            nodes = s.scalars(select(NodeRow).order_by(NodeRow.name)).all()
            running = s.scalars(select(WorkloadRow).where(
                WorkloadRow.state.in_(("running", "releasing", "stopping")))).all()
            mine = None if self.is_admin else set(org.projects_of(s, self.username))
        share: dict = {}
        for w in running:
            visible = mine is None or w.project in mine
            for p in w.placement:
                for i in p["gpu_indices"]:
                    share.setdefault((p["node"], i), []).append(
                        (w.name if visible else "(other project)", w.project if visible else "",
                         p["gpu_milli"] / 1000, w.over_quota))
        rows = []
        for n in nodes:
            for g in n.gpus:
                users = share.get((n.name, g["index"]), [])
                rows.append({"node": n.name, "index": g["index"], "model": g["model"],
                             "memory_gib": g["memory_mib"] / 1024, "users": users,
                             "allocated": sum(u[2] for u in users)})
        self.render_page("nodes.html", rows=rows, nodes=nodes)


def routes(prefix):
    return [(prefix + r"/nodes", NodesPage)]
