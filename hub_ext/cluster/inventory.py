"""The cluster's own inventory on Kubernetes: nodes and their GPUs as gpupool-node-agent
publishes them on the Node objects, and the pods gpupool-scheduler placed on each GPU (its
bind annotations). Watched through the API server and copied into the ``nodes`` table, which
the admin panel and the REST API read; there are no declared GPUs on Kubernetes. A change
rebuilds only its node's row, and the rows are written in batches (``InventorySync``).

Each GPU of a node row carries ``pods``: ``[{pod, namespace, project, gpu, over_quota}]``, the pods
sharing it (``gpu`` in GPUs, e.g. 0.5 for half of one).
"""

from __future__ import annotations

import asyncio
import json
import logging

from sqlalchemy import delete, select

from scheduler.kubernetes.client import KubeClient
from scheduler.kubernetes.objects import A, parse_node
from scheduler.model import MILLI

from ..db.tables import NodeRow
from .mirror import Mirror

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


def _node_inputs(node: dict) -> tuple:
    """What a node's row is made of: a change elsewhere (a kubelet's heartbeat in its
    conditions) changes nothing the inventory stores."""
    meta, status = node["metadata"], node.get("status") or {}
    return (meta.get("labels"), meta.get("annotations"), status.get("allocatable"), status.get("capacity"))


def _pod_entry(pod: dict | None) -> tuple | None:
    """(node, GPU indices, GPUs of each, project, over quota) of a pod on a GPU, else None."""
    if pod is None or (share := pod_share(pod)) is None:
        return None
    meta = pod["metadata"]
    ann, labels = meta.get("annotations") or {}, meta.get("labels") or {}
    return (*share, ann.get(A.PROJECT) or labels.get(A.PROJECT) or "", ann.get(A.OVER_QUOTA_PLACED) == "true")


class InventorySync(Mirror):
    """Watches Nodes (cluster-wide) and the pods of ``namespace``. A change touches only the
    row of its node (a pod's: the nodes it leaves and joins), and only when it changes what
    the row holds; changed rows are written together, at most once every ``flush_s``."""

    def __init__(self, kc: KubeClient, Session, namespace: str, retry_s: float = 2.0, flush_s: float = 1.0):
        super().__init__(kc, Session, {"nodes": "/api/v1/nodes",
                                       "pods": f"/api/v1/namespaces/{namespace}/pods"}, retry_s)
        self.flush_s = flush_s
        self.dirty: set[str] = set()  # node names whose row is to be built and written
        self.stats = {"rows_built": 0, "writes": 0}
        self._written: dict[str, tuple] = {}  # name -> what its row held when last written
        self._all = False  # a whole path read again: rows of gone nodes are deleted
        self._flush: asyncio.TimerHandle | None = None

    def listed(self, kind: str) -> None:
        self._all = True
        self.dirty.update(n["metadata"]["name"] for n in self.objects["nodes"].values())
        self._schedule(now=not self._written)  # the first copy at once: the panel shows it

    def updated(self, kind: str, old: dict | None, new: dict | None) -> None:
        if kind == "nodes":
            if old is None or new is None or _node_inputs(old) != _node_inputs(new):
                self.dirty.add((new or old or {})["metadata"]["name"])
        else:
            before, after = _pod_entry(old), _pod_entry(new)
            if before == after:  # the same pod (one key): its phase, a probe, changes nothing
                return
            self.dirty.update(e[0] for e in (before, after) if e is not None)
        if self.dirty:
            self._schedule()

    def _schedule(self, now: bool = False) -> None:
        if self._flush is not None and not now:
            return
        if self._flush is not None:
            self._flush.cancel()
        self._flush = asyncio.get_running_loop().call_later(0 if now else self.flush_s, self.flush)

    def flush(self) -> None:
        """Build the dirty nodes' rows from the copy and write those that changed, at once."""
        if self._flush is not None:
            self._flush.cancel()
            self._flush = None
        names, self.dirty = self.dirty, set()
        nodes = {n["metadata"]["name"]: n for n in self.objects["nodes"].values()}
        pods = {k: p for k, p in self.objects["pods"].items()
                if (p.get("spec") or {}).get("nodeName") in names}
        built = rows({n: nodes[n] for n in names if n in nodes}, pods)
        self.stats["rows_built"] += len(built)
        new = {r.name: r for r in built
               if self._written.get(r.name) != (r.pool, r.gpus, r.cpu_milli, r.memory_mib)}
        gone = {n for n in names if n not in nodes}
        everything, self._all = self._all, False
        try:
            with self.Session() as s:
                if everything:
                    gone |= {n for (n,) in s.execute(select(NodeRow.name)) if n not in nodes}
                for name in gone:
                    s.execute(delete(NodeRow).where(NodeRow.name == name))
                for r in new.values():
                    s.merge(r)
                if gone or new:
                    s.commit()
                    self.stats["writes"] += 1
        except Exception:
            log.exception("writing the cluster's inventory failed")
            self.dirty |= names  # again after flush_s
            self._all |= everything
            self._schedule()
            return
        for name in gone:
            self._written.pop(name, None)
        for r in new.values():
            self._written[r.name] = (r.pool, r.gpus, r.cpu_milli, r.memory_mib)
