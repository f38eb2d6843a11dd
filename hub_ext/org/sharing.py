"""Which workloads share each GPU, as the nodes page and the nodes API both show it."""

from __future__ import annotations

from sqlalchemy import select

from ..db.tables import NodeRow, WorkloadRow

HOLDING = ("running", "releasing", "stopping")


def gpu_sharing(session, mine: set[str] | None):
    """(nodes, {(node, gpu index): [{workload, project, gpu, over_quota}]}); workloads of
    projects outside ``mine`` (hub_ext.org.roles.visible_projects; None: all) have no names."""
    nodes = session.scalars(select(NodeRow).order_by(NodeRow.name)).all()
    running = session.scalars(select(WorkloadRow).where(WorkloadRow.state.in_(HOLDING))).all()
    share: dict[tuple[str, int], list[dict]] = {}
    cluster = {n.name for n in nodes if n.source == "kubernetes"}
    for n in nodes:  # on Kubernetes the pods gpupool-scheduler bound (hub_ext.cluster.inventory)
        for g in n.gpus if n.name in cluster else ():
            for pod in g.get("pods", ()):
                visible = mine is None or pod["project"] in mine
                share.setdefault((n.name, g["index"]), []).append({
                    "workload": f"{pod['namespace']}/{pod['pod']}" if visible else "(other project)",
                    "project": pod["project"] if visible else "",
                    "gpu": pod["gpu"], "over_quota": pod.get("over_quota", False),
                })
    for w in running:
        visible = mine is None or w.project in mine
        for p in w.placement:
            if p["node"] in cluster:  # the node's pods say who holds its GPUs
                continue
            for i in p["gpu_indices"]:
                share.setdefault((p["node"], i), []).append({
                    "workload": w.name if visible else "(other project)",
                    "project": w.project if visible else "",
                    "gpu": p["gpu_milli"] / 1000,
                    "over_quota": bool(w.over_quota),
                })
    return nodes, share
