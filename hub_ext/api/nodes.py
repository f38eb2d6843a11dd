"""REST API v1 of the GPUs: the nodes and their GPUs (``/nodes``), and the spawn form's
live figures (``/capacity``)."""

from __future__ import annotations

from ..org import roles
from ..org.sharing import gpu_sharing
from ..requests import capacity
from ..requests.limits import limits_for
from .base import ApiHandler


class NodesHandler(ApiHandler):
    def get(self):
        self.require("view_cluster")
        with self.Session() as s:
            nodes, share = gpu_sharing(s, roles.visible_projects(self.who))
        items = []
        for n in nodes:
            gpus = []
            for g in n.gpus:
                users = share.get((n.name, g["index"]), [])
                users = [{k: u[k] for k in ("workload", "project", "gpu")} for u in users]
                gpus.append({**{k: v for k, v in g.items() if k != "pods"}, "allocated": round(sum(u["gpu"] for u in users), 3), "workloads": users})
            items.append({"name": n.name, "pool": n.pool, "source": n.source, "cpu_milli": n.cpu_milli,
                          "memory_mib": n.memory_mib, "gpus": gpus})
        self.send({"items": items})


class CapacityHandler(ApiHandler):
    """The spawn form's live figures (hub_ext.requests.capacity) for the projects the caller may
    submit to."""

    def get(self):
        mine = tuple(roles.submit_projects(self.who))
        with self.Session() as s:
            self.send(capacity.status(s, limits_for(s, self.ctx.cfg, self.username, projects=mine)))

    def post(self):
        """The live figures with ``request``: what Start would answer to the body (the spawn
        form's fields, or a POST /workloads body), by the request rules themselves."""
        data = self.body()
        mine = tuple(roles.submit_projects(self.who))
        with self.Session() as s:
            limits = limits_for(s, self.ctx.cfg, self.username, projects=mine)
            self.send({**capacity.status(s, limits), "request": capacity.answer(s, limits, data)})


__all__ = ["CapacityHandler", "NodesHandler"]
