"""What the pods gpupool does not schedule hold on each node: DaemonSets, static pods, other
schedulers' pods. kube-scheduler counts every pod's requests against a node's allocatable;
so does gpupool-scheduler, by giving the core each node less what these pods request.

A pod holds its requests from when it is bound (``spec.nodeName``) until it is Succeeded or
Failed or gone, as in kube-scheduler's NodeResourcesFit. GPUs such a pod takes are picked by
the device plugin, not by gpupool: the node is given that many GPUs fewer (its last ones).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from decimal import Decimal
from typing import Any

from ..contract import GPU_RESOURCE
from ..model import Node
from .objects import parse_quantity

__all__ = ["Held", "OtherPods", "held_by"]


@dataclass(frozen=True)
class Held:
    node: str
    cpu_milli: int
    memory_mib: int
    gpus: int


def _request(c: dict[str, Any], resource: str, where: str) -> Decimal:
    res = c.get("resources") or {}
    # A request left out defaults to the limit (the API server does the same).
    v = (res.get("requests") or {}).get(resource) or (res.get("limits") or {}).get(resource)
    return Decimal(0) if v is None else parse_quantity(v, where)


def _pod_request(spec: dict[str, Any], resource: str) -> Decimal:
    """The sum over containers, or the largest init container if more; plus the overhead."""
    run = sum((_request(c, resource, resource) for c in spec.get("containers") or ()), Decimal(0))
    init = max((_request(c, resource, resource) for c in spec.get("initContainers") or ()), default=Decimal(0))
    overhead = (spec.get("overhead") or {}).get(resource)
    return max(run, init) + (parse_quantity(overhead, resource) if overhead else 0)


def held_by(pod: dict[str, Any]) -> Held | None:
    """What a pod holds on its node; None when it holds nothing (unbound, finished, gone)."""
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    node = spec.get("nodeName")
    if not node or status.get("phase") in ("Succeeded", "Failed"):
        return None
    return Held(node, math.ceil(_pod_request(spec, "cpu") * 1000),
                math.ceil(_pod_request(spec, "memory") / 2**20), int(_pod_request(spec, GPU_RESOURCE)))


class OtherPods:
    """The pods gpupool does not schedule, by node."""

    def __init__(self) -> None:
        self.pods: dict[str, Held] = {}
        self.on: dict[str, dict[str, Held]] = {}  # node -> pod key -> held

    def set(self, key: str, held: Held | None) -> set[str]:
        """Record what pod ``key`` holds now; the nodes whose usage changed."""
        old = self.pods.pop(key, None)
        if old == held:
            if held is not None:
                self.pods[key] = held
            return set()
        changed = set()
        if old is not None:
            self.on[old.node].pop(key, None)
            if not self.on[old.node]:
                del self.on[old.node]
            changed.add(old.node)
        if held is not None:
            self.pods[key] = held
            self.on.setdefault(held.node, {})[key] = held
            changed.add(held.node)
        return changed

    def usable(self, node: Node, in_use: int = 0) -> Node:
        """``node`` less what the other pods on it hold. ``in_use``: GPUs 0 .. in_use-1 hold
        gpupool's work, and stay (the core numbers a node's GPUs from 0 without gaps)."""
        held = self.on.get(node.name)
        if not held:
            return node
        cpu = sum(h.cpu_milli for h in held.values())
        mem = sum(h.memory_mib for h in held.values())
        gpus = sum(h.gpus for h in held.values())
        keep = max(len(node.gpus) - gpus, min(in_use, len(node.gpus)), 0)
        return replace(node, cpu_milli=max(0, node.cpu_milli - cpu), memory_mib=max(0, node.memory_mib - mem),
                       gpus=node.gpus[:keep])
