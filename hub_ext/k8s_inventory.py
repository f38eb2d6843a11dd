"""The cluster's own inventory on Kubernetes: nodes and their GPUs as gpupool-node-agent
publishes them on the Node objects, and the pods gpupool-scheduler placed on each GPU (its
bind annotations). Watched through the API server and copied into the ``nodes`` table, which
the admin panel and the REST API read; there are no declared GPUs on Kubernetes.

Each GPU of a node row carries ``pods``: ``[{pod, namespace, project, gpu, over_quota}]``, the pods
sharing it (``gpu`` in GPUs, e.g. 0.5 for half of one).
"""

from __future__ import annotations

import json
import logging

from sqlalchemy import delete, select

from scheduler.k8s.client import KubeClient
from scheduler.k8s.objects import A, parse_node
from scheduler.model import MILLI

from .db import NodeRow
from .k8s_mirror import Mirror

log = logging.getLogger("gpupool.k8s_inventory")

SOURCE = "kubernetes"
NODE_GPUS = "gpupool.io/gpus"  # the node agent's JSON list: index, uuid, model, memory_mib
NODE_USAGE = "gpupool.io/gpu-usage"  # its JSON list: index, memory_used_mib, utilization (%)


def _by_index(node: dict, annotation: str) -> dict[int, dict]:
    """A node agent's JSON list annotation, by GPU index ({} when absent or unreadable)."""
    raw = ((node["metadata"].get("annotations") or {}).get(annotation)) or ""
    try:
        return {int(g["index"]): g for g in (json.loads(raw) if raw else [])}
    except (ValueError, TypeError, KeyError):
        log.warning("node %s: unreadable %s annotation", node["metadata"]["name"], annotation)
        return {}


def node_gpus(node: dict) -> list[dict]:
    """The node's GPUs: count, model and memory from its labels and allocatable (what
    gpupool-scheduler reads), each GPU's own model, memory and UUID from the node agent's
    ``gpupool.io/gpus`` annotation, and its use from ``gpupool.io/gpu-usage``, where it has
    them."""
    parsed = parse_node(node)
    detail, usage = _by_index(node, NODE_GPUS), _by_index(node, NODE_USAGE)
    out = []
    for g in parsed.gpus:
        d, u = detail.get(g.index, {}), usage.get(g.index, {})
        out.append({"index": g.index, "model": str(d.get("model") or g.model),
                    "memory_mib": int(d.get("memory_mib") or g.memory_mib),
                    "uuid": str(d.get("uuid") or g.uuid), "pods": [],
                    "utilization_pct": u.get("utilization"), "memory_used_mib": u.get("memory_used_mib")})
    return out


def pod_share(pod: dict) -> tuple[str, list[int], float] | None:
    """(node, GPU indices, GPUs of each) of a pod gpupool-scheduler bound and that has not
    ended; None for any other pod."""
    meta, spec = pod["metadata"], pod.get("spec") or {}
    ann = meta.get("annotations") or {}
    node = spec.get("nodeName")
    if not node or A.GPU_INDICES not in ann or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
        return None
    try:
        idx = [int(i) for i in ann[A.GPU_INDICES].split(",") if i.strip()]
        milli = int(ann.get(A.GPU_MILLI, MILLI))
    except ValueError:
        return None
    return node, idx, milli / MILLI


def rows(nodes: dict[str, dict], pods: dict[str, dict]) -> list[NodeRow]:
    out = {}
    for n in nodes.values():
        parsed = parse_node(n)
        out[parsed.name] = NodeRow(name=parsed.name, pool=parsed.pool, gpus=node_gpus(n), cpu_milli=parsed.cpu_milli,
                            memory_mib=parsed.memory_mib, source=SOURCE)
    for _, p in sorted(pods.items()):
        share = pod_share(p)
        if share is None or share[0] not in out:
            continue
        node, idx, gpu = share
        meta = p["metadata"]
        ann, labels = meta.get("annotations") or {}, meta.get("labels") or {}
        project = ann.get(A.PROJECT) or labels.get(A.PROJECT) or ""
        for g in out[node].gpus:
            if g["index"] in idx:
                g["pods"].append({"pod": meta["name"], "namespace": meta.get("namespace", ""),
                                  "project": project, "gpu": gpu,
                                  "over_quota": ann.get(A.OVER_QUOTA_PLACED) == "true"})
    return list(out.values())


class InventorySync(Mirror):
    """Watches Nodes (cluster-wide) and the pods of ``namespace``; after each change the
    ``nodes`` table is made equal to the cluster."""

    def __init__(self, kc: KubeClient, Session, namespace: str, retry_s: float = 2.0):
        super().__init__(kc, Session, {"nodes": "/api/v1/nodes",
                                       "pods": f"/api/v1/namespaces/{namespace}/pods"}, retry_s)
        self._last: list | None = None

    def apply(self) -> None:
        new = rows(self.objects["nodes"], self.objects["pods"])
        seen = [(r.name, r.pool, r.gpus, r.cpu_milli, r.memory_mib) for r in new]
        if seen == self._last:  # kwok's and the kubelet's heartbeats change nothing shown
            return
        self._last = seen
        with self.Session() as s:
            names = {r.name for r in new}
            for (name,) in s.execute(select(NodeRow.name)).all():
                if name not in names:
                    s.execute(delete(NodeRow).where(NodeRow.name == name))
            for r in new:
                s.merge(r)
            s.commit()
