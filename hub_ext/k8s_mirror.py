"""A copy of some Kubernetes objects kept current by list and watch, for the hub's followers
of the cluster (hub_ext.k8s_org: the organisation; hub_ext.k8s_inventory: nodes and pods).

Each path is listed, then watched from the list's version; a watch that ends goes on from
the last version seen, and a 410 (that version is too old) or an error lists again. After
every change, once each path has been listed, ``apply`` makes the hub's rows match."""

from __future__ import annotations

import asyncio
import logging

from scheduler.k8s.client import ApiError, KubeClient

log = logging.getLogger("gpupool")


def key(obj: dict) -> str:
    """``namespace/name``, or ``name`` for a cluster-scoped object."""
    meta = obj.get("metadata") or {}
    return f"{meta['namespace']}/{meta.get('name', '')}" if meta.get("namespace") else meta.get("name", "")


class Mirror:
    def __init__(self, kc: KubeClient, Session, paths: dict[str, str], retry_s: float = 2.0):
        self.kc = kc
        self.Session = Session
        self.paths = paths
        self.retry_s = retry_s
        self.objects: dict[str, dict[str, dict]] = {k: {} for k in paths}
        self.synced = dict.fromkeys(paths, False)
        self._tasks: list[asyncio.Task] = []

    def start(self) -> None:
        self._tasks = [asyncio.ensure_future(self._follow(k)) for k in self.paths]

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def apply(self) -> None:
        """Make the hub's rows match ``objects`` (called once every path is listed)."""
        raise NotImplementedError

    def _changed(self) -> None:
        if all(self.synced.values()):  # every list first: a half copy looks like deletions
            self.apply()

    async def _follow(self, kind: str) -> None:
        path = self.paths[kind]
        while True:
            try:
                items, rv = await self.kc.list_all(path)
                self.objects[kind] = {key(o): o for o in items}
                self.synced[kind] = True
                self._changed()
                while True:  # a watch ends after its timeout: go on from the last version
                    async for ev in self.kc.watch(path, rv):
                        obj = ev.get("object") or {}
                        rv = (obj.get("metadata") or {}).get("resourceVersion", rv)
                        if ev["type"] == "BOOKMARK":
                            continue
                        if ev["type"] == "DELETED":
                            self.objects[kind].pop(key(obj), None)
                        else:
                            self.objects[kind][key(obj)] = obj
                        self._changed()
            except asyncio.CancelledError:
                raise
            except ApiError as e:
                if e.status != 410:  # 410: the version is too old, list again at once
                    log.warning("watching %s: %s", path, e)
                    await asyncio.sleep(self.retry_s)
            except Exception:
                log.exception("watching %s failed", path)
                await asyncio.sleep(self.retry_s)
