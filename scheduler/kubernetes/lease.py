"""Leader election through a ``coordination.k8s.io/v1`` Lease, as client-go does it.

A candidate takes the Lease when it is free or expired (renewTime + duration in the past)
and renews it every ``renew_s``; every write is a compare-and-swap on resourceVersion, so
two candidates never both hold it. A holder that cannot renew within two thirds of the duration
stops leading (``lost`` is set) and must stop acting: the adapter exits, and its pod restarts.
On a clean shutdown the holder empties holderIdentity so a successor starts at once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import datetime, timezone

from .client import ApiError, KubeClient

__all__ = ["LeaderElector"]

log = logging.getLogger("gpupool.k8s.lease")


def _micro(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse_micro(s: str | None) -> float:
    if not s:
        return 0.0
    for fmt in ("%Y-%m-%dT%H:%M:%S.%fZ", "%Y-%m-%dT%H:%M:%SZ"):
        try:
            return datetime.strptime(s, fmt).replace(tzinfo=timezone.utc).timestamp()
        except ValueError:
            continue
    return 0.0


class LeaderElector:
    def __init__(self, kc: KubeClient, namespace: str, name: str, identity: str,
                 duration_s: float = 15.0, renew_s: float = 5.0, retry_s: float = 1.0):
        self.kc, self.identity = kc, identity
        self.path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}"
        self.create_path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
        self.name, self.namespace = name, namespace
        self.duration_s, self.renew_s, self.retry_s = duration_s, renew_s, retry_s
        self.lost = asyncio.Event()
        self._lease: dict | None = None
        self._task: asyncio.Task | None = None

    def _spec(self, now: float, transitions: int, acquire: float) -> dict:
        return {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": max(1, round(self.duration_s)),
            "acquireTime": _micro(acquire),
            "renewTime": _micro(now),
            "leaseTransitions": transitions,
        }

    async def _try_once(self) -> bool:
        now = time.time()
        try:
            lease = await self.kc.get(self.path)
        except ApiError as e:
            if e.status != 404:
                raise
            body = {
                "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": self._spec(now, 0, now),
            }  # fmt: skip
            try:
                self._lease = await self.kc.post(self.create_path, body)
                return True
            except ApiError as e2:
                if e2.status == 409:
                    return False
                raise
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        renewed = _parse_micro(spec.get("renewTime"))
        duration = spec.get("leaseDurationSeconds") or self.duration_s
        if holder and holder != self.identity and renewed + duration > now:
            return False  # someone else holds a live lease
        transitions = spec.get("leaseTransitions") or 0
        acquire = _parse_micro(spec.get("acquireTime")) if holder == self.identity else now
        if holder != self.identity:
            transitions += 1
        lease["spec"] = self._spec(now, transitions, acquire or now)
        try:
            self._lease = await self.kc.put(self.path, lease)  # CAS on resourceVersion
            return True
        except ApiError as e:
            if e.status == 409:
                return False
            raise

    async def acquire(self) -> None:
        """Wait until this candidate leads, then keep renewing in the background."""
        while True:
            try:
                if await self._try_once():
                    break
            except (ApiError, OSError, asyncio.TimeoutError) as e:
                log.warning("lease: %s", e)
            await asyncio.sleep(self.retry_s)
        log.info("leading as %s", self.identity)
        self._task = asyncio.create_task(self._renew_loop())

    async def _renew_loop(self) -> None:
        last_ok = time.monotonic()
        while True:
            await asyncio.sleep(self.renew_s)
            try:
                if await self._try_once():
                    last_ok = time.monotonic()
                    continue
                log.error("lease taken by another candidate")
                break
            except (ApiError, OSError, asyncio.TimeoutError) as e:
                log.warning("lease renew failed: %s", e)
            # Give up well before the Lease can expire (client-go's renewDeadline): a
            # successor may take it at expiry, and two leaders must never overlap.
            if time.monotonic() - last_ok > self.duration_s * 2 / 3:
                log.error("could not renew the lease within %.1fs", self.duration_s * 2 / 3)
                break
        self.lost.set()

    async def release(self) -> None:
        if self._task is not None:
            self._task.cancel()
        if self._lease is None or self.lost.is_set():
            return
        lease = dict(self._lease)
        lease["spec"] = {**lease["spec"], "holderIdentity": "", "renewTime": _micro(time.time())}
        try:
            await self.kc.put(self.path, lease)
        except (ApiError, OSError, asyncio.TimeoutError) as e:  # best effort
            log.warning("lease release failed: %s", e)
