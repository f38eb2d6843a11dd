"""Nodes and GPUs: which workloads share each GPU and how much."""

from __future__ import annotations

from tornado import web

from ...org import roles
from ...org.sharing import gpu_sharing
from .base import PageHandler


class NodesPage(PageHandler):
    @web.authenticated
    def get(self):
        with self.Session() as s:
            nodes, share = gpu_sharing(s, roles.visible_projects(self.who))
        rows = []
        for n in nodes:
            for g in n.gpus:
                users = [(u["workload"], u["project"], u["gpu"], u["over_quota"])
                         for u in share.get((n.name, g["index"]), [])]
                rows.append({"node": n.name, "index": g["index"], "model": g["model"],
                             "memory_gib": g["memory_mib"] / 1024, "uuid": g.get("uuid", ""),
                             "users": users,
                             "allocated": sum(u[2] for u in users),
                             "utilization": g.get("utilization_pct")})  # the node agent's, on Kubernetes
        self.render_page("nodes.html", rows=rows, nodes=nodes)


def routes(prefix):
    return [(prefix + r"/nodes", NodesPage)]
