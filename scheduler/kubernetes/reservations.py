"""GPUs reserved through the kubelet for fractions (decision 0060), with ``--gpu-reservations``.

The first fraction placed on GPU slot ``i`` of a node makes the binder create a reservation
pod there (``nvidia.com/gpu: 1``, bound by ``nodeName``): the device plugin gives it one
physical GPU, which no other container can then get. Its container (``main`` below, the
scheduler's image) writes the UUID the device plugin gave it (``NVIDIA_VISIBLE_DEVICES``) on
its own pod; every fraction on that slot is given that UUID in its ConfigMap. The binder
deletes a reservation once no fraction is placed on its slot.

Reservation pods are not scheduled by gpupool and are not counted as other pods
(``other_pods``): the slot they hold is the fractions' own, counted by the core.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from typing import Any

from ..contract import GPU_RESOURCE
from .client import ApiError, KubeClient
from .config import RESERVATION_COMMAND

__all__ = ["LABEL", "RESERVED", "Reservations", "reservation_name", "reservation_pod"]

JSON = dict[str, Any]
LABEL = "gpupool.io/gpu-reservation"  # on reservation pods: NODE.INDEX
RESERVED = "gpupool.io/reserved-gpu"  # the GPU's UUID, written by the reservation itself
INDEX = "gpupool.io/gpu-index"


def reservation_name(node: str, index: int) -> str:
    return f"gpupool-reservation-{node}-{index}"[:253]


def reservation_pod(node: str, index: int, namespace: str, image: str, service_account: str,
                    command: tuple[str, ...] = RESERVATION_COMMAND) -> JSON:
    """The reservation of GPU slot ``index`` of ``node``; ``command`` empty: the image's entrypoint."""
    pod: JSON = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": reservation_name(node, index), "namespace": namespace,
                     "labels": {LABEL: "true", "app.kubernetes.io/managed-by": "gpupool-scheduler"},
                     "annotations": {INDEX: str(index), "gpupool.io/node": node}},
        "spec": {
            "nodeName": node, "serviceAccountName": service_account, "terminationGracePeriodSeconds": 0,
            "tolerations": [{"operator": "Exists"}],
            "containers": [{
                "name": "reserve", "image": image,
                "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}}],
                "resources": {"requests": {"cpu": "1m", "memory": "16Mi"}, "limits": {GPU_RESOURCE: "1"}},
            }],
        },
    }  # fmt: skip
    if command:
        pod["spec"]["containers"][0]["command"] = list(command)
    return pod


def _slot(obj: JSON) -> tuple[str, int] | None:
    ann = obj["metadata"].get("annotations") or {}
    try:
        return ann["gpupool.io/node"], int(ann[INDEX])
    except (KeyError, ValueError):
        return None


class Reservations:
    """The reservation pods, by (node, GPU slot), as the watch last showed them."""

    def __init__(self) -> None:
        self.pods: dict[tuple[str, int], JSON] = {}
        self._changed = asyncio.Event()

    def on_pod(self, etype: str, obj: JSON) -> None:
        slot = _slot(obj)
        if slot is None:
            return
        if etype == "DELETED":
            if (self.pods.get(slot) or {}).get("metadata", {}).get("uid") == obj["metadata"].get("uid"):
                del self.pods[slot]
        else:
            self.pods[slot] = obj
        self._changed.set()
        self._changed = asyncio.Event()

    def uuid(self, node: str, index: int) -> str | None:
        obj = self.pods.get((node, index))
        if obj is None or obj["metadata"].get("deletionTimestamp"):
            return None
        return (obj["metadata"].get("annotations") or {}).get(RESERVED) or None

    async def ensure(self, kc: KubeClient, node: str, index: int, namespace: str, image: str,
                     service_account: str, timeout_s: float,
                     command: tuple[str, ...] = RESERVATION_COMMAND) -> str:
        """The UUID of the GPU reserved for slot ``index`` of ``node``: the reservation is made
        if there is none, and waited for (at most ``timeout_s``). Raises TimeoutError."""
        if (uuid := self.uuid(node, index)) is not None:
            return uuid
        if (node, index) not in self.pods:
            try:
                await kc.post(f"/api/v1/namespaces/{namespace}/pods",
                              reservation_pod(node, index, namespace, image, service_account, command))
            except ApiError as e:
                if e.status != 409:  # one made by an earlier bind (or life of the scheduler)
                    raise
        deadline = time.monotonic() + timeout_s
        while (uuid := self.uuid(node, index)) is None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"the GPU reservation on {node} slot {index} got no GPU within {timeout_s:g}s")
            try:
                await asyncio.wait_for(self._changed.wait(), timeout=left)
            except asyncio.TimeoutError:
                pass
        return uuid

    def unused(self, in_use: set[tuple[str, int]]) -> list[JSON]:
        """Reservations whose slot holds no fraction."""
        return [obj for slot, obj in sorted(self.pods.items())
                if slot not in in_use and not obj["metadata"].get("deletionTimestamp")]


async def _publish(uuid: str) -> None:
    async with await KubeClient.from_kubeconfig(None) as kc:
        ns, name = os.environ["POD_NAMESPACE"], os.environ["POD_NAME"]
        await kc.patch(f"/api/v1/namespaces/{ns}/pods/{name}", {"metadata": {"annotations": {RESERVED: uuid}}})


def main() -> int:
    """The reservation's container: say which GPU the device plugin gave it, then hold it."""
    uuid = os.environ.get("NVIDIA_VISIBLE_DEVICES", "").split(",")[0].strip()
    if not uuid or uuid in ("all", "none", "void"):
        print(f"gpupool reservation: no single GPU given (NVIDIA_VISIBLE_DEVICES={uuid!r})", file=sys.stderr)
        return 1
    asyncio.run(_publish(uuid))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    while True:
        signal.pause()


if __name__ == "__main__":
    sys.exit(main())
