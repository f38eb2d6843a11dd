"""A pod's PersistentVolumeClaims as kube-scheduler's VolumeBinding plugin treats them.

Before placement (``needs``): a claim bound (or pre-bound) to a volume restricts the pod to
the nodes of that volume's node affinity; an unbound claim of a ``WaitForFirstConsumer``
class restricts it to the class's allowed topologies; a claim that does not exist, or whose
class does not, keeps the pod waiting, with kube-scheduler's words. An unbound claim of an
``Immediate`` class (or of no class) restricts nothing: kube-scheduler waits until the PV
controller binds it, gpupool binds the pod and leaves that wait to the kubelet (the one
difference, so that clusters without a provisioner for such claims still run the pods).

Before the Binding (``prebind``): each unbound ``WaitForFirstConsumer`` claim gets the
annotation ``volume.kubernetes.io/selected-node`` (the external provisioner then makes the
volume on that node), and the pod is bound only once those claims are Bound.

The claims, volumes and classes come from the watcher's watches (``on_claim``, ...); this
module only reads them, and writes the one annotation.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from ..constraints import Requirement, Term
from ..model import ValidationError
from .client import KubeClient
from .objects import node_terms

__all__ = ["SELECTED_NODE", "Volumes"]

JSON = dict[str, Any]
SELECTED_NODE = "volume.kubernetes.io/selected-node"
WAIT_FOR_CONSUMER = "WaitForFirstConsumer"
DEFAULT_CLASS = "storageclass.kubernetes.io/is-default-class"


def _class_terms(sc: JSON) -> tuple[Term, ...] | None:
    """A StorageClass's allowedTopologies as node selector terms (None: anywhere)."""
    topo = sc.get("allowedTopologies")
    if not topo:
        return None
    return tuple(Term(tuple(Requirement(str(e.get("key", "")), "In", tuple(str(v) for v in e.get("values") or ()))
                            for e in t.get("matchLabelExpressions") or ()))
                 for t in topo)


class Volumes:
    """The cluster's claims, volumes and classes, as the watches last showed them."""

    def __init__(self) -> None:
        self.claims: dict[str, JSON] = {}  # namespace/name -> PersistentVolumeClaim
        self.volumes: dict[str, JSON] = {}  # name -> PersistentVolume
        self.classes: dict[str, JSON] = {}  # name -> StorageClass
        self._changed = asyncio.Event()

    def _bump(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    # -------------------------------------------------------------------- the watches
    def on_claim(self, etype: str, obj: JSON) -> str:
        """The claim's key (namespace/name)."""
        m = obj["metadata"]
        key = f"{m.get('namespace')}/{m['name']}"
        if etype == "DELETED":
            self.claims.pop(key, None)
        else:
            self.claims[key] = obj
        self._bump()
        return key

    def on_volume(self, etype: str, obj: JSON) -> str | None:
        """The key of the claim the volume is bound to, if any."""
        name = obj["metadata"]["name"]
        if etype == "DELETED":
            self.volumes.pop(name, None)
        else:
            self.volumes[name] = obj
        self._bump()
        ref = (obj.get("spec") or {}).get("claimRef") or {}
        return f"{ref.get('namespace')}/{ref.get('name')}" if ref.get("name") else None

    def on_class(self, etype: str, obj: JSON) -> None:
        name = obj["metadata"]["name"]
        if etype == "DELETED":
            self.classes.pop(name, None)
        else:
            self.classes[name] = obj
        self._bump()

    # -------------------------------------------------------------------- placement
    def _class_of(self, pvc: JSON) -> tuple[str | None, JSON | None]:
        name = (pvc.get("spec") or {}).get("storageClassName")
        if name is None:  # the cluster's default class (as the admission plugin would set)
            for sc in self.classes.values():
                if (sc["metadata"].get("annotations") or {}).get(DEFAULT_CLASS) == "true":
                    return sc["metadata"]["name"], sc
            return None, None
        return name, self.classes.get(name)

    def needs(self, namespace: str, claims: tuple[str, ...]) -> tuple[str | None, tuple[tuple[Term, ...], ...]]:
        """(Why the pod cannot be placed yet, None when it can; the node affinity groups its
        volumes add, each to hold by any of its terms.)"""
        groups: list[tuple[Term, ...]] = []
        for c in claims:
            pvc = self.claims.get(f"{namespace}/{c}")
            if pvc is None:
                return f'persistentvolumeclaim "{c}" not found', ()
            if pvc["metadata"].get("deletionTimestamp"):
                return f'persistentvolumeclaim "{c}" is being deleted', ()
            volume = (pvc.get("spec") or {}).get("volumeName")
            if volume:
                pv = self.volumes.get(volume)
                if pv is None:
                    return f'persistentvolumeclaim "{c}" is bound to a volume "{volume}" that does not exist', ()
                try:
                    terms = node_terms(((pv.get("spec") or {}).get("nodeAffinity") or {}).get("required"),
                                       f"persistentvolume {volume} nodeAffinity")
                except ValidationError as e:
                    return str(e), ()
                if terms is not None:
                    groups.append(terms)
                continue
            cls, sc = self._class_of(pvc)
            if cls and sc is None:
                return f'storageclass.storage.k8s.io "{cls}" not found', ()
            if sc is not None and sc.get("volumeBindingMode") == WAIT_FOR_CONSUMER:
                terms = _class_terms(sc)
                if terms is not None:
                    groups.append(terms)
        return None, tuple(groups)

    # ------------------------------------------------------------------------ binding
    def _phase(self, namespace: str, c: str) -> str:
        return str(((self.claims.get(f"{namespace}/{c}") or {}).get("status") or {}).get("phase", ""))

    async def prebind(self, kc: KubeClient, namespace: str, claims: tuple[str, ...], node: str,
                      timeout_s: float) -> None:
        """Select ``node`` on each unbound WaitForFirstConsumer claim, then wait (at most
        ``timeout_s``) until those claims are Bound. Raises TimeoutError."""
        selected = []
        for c in claims:
            pvc = self.claims.get(f"{namespace}/{c}")
            if pvc is None or self._phase(namespace, c) == "Bound" or (pvc.get("spec") or {}).get("volumeName"):
                continue
            _, sc = self._class_of(pvc)
            if sc is None or sc.get("volumeBindingMode") != WAIT_FOR_CONSUMER:
                continue
            selected.append(c)
            if (pvc["metadata"].get("annotations") or {}).get(SELECTED_NODE) != node:
                await kc.patch(f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/{c}",
                               {"metadata": {"annotations": {SELECTED_NODE: node}}})
        deadline = time.monotonic() + timeout_s
        while not all(self._phase(namespace, c) == "Bound" for c in selected):
            left = deadline - time.monotonic()
            if left <= 0:
                waiting = [c for c in selected if self._phase(namespace, c) != "Bound"]
                raise TimeoutError(f"claims {', '.join(waiting)} not bound within {timeout_s:g}s")
            changed = self._changed
            try:
                await asyncio.wait_for(changed.wait(), timeout=left)
            except asyncio.TimeoutError:
                continue
