"""A copy of some Kubernetes objects kept current by list and watch, shared by the hub's
followers of the cluster (hub_ext.cluster.org: the organisation; hub_ext.cluster.inventory: nodes
and pods; hub_ext.training.kubernetes: training pods; hub_ext.serving.published: the
published services) so that none of them lists the API server in a loop.

Each path is listed (``selectors``: a label selector per path), then watched from the list's
version; a watch that ends goes on from the last version seen, and a 410 (that version is
too old) or an error lists again. Once every path has been listed, each change calls
``listed`` (a whole path read again) or ``updated`` (one object), whose default is ``apply``
(make the hub's rows match), and moves ``version`` on: ``wait_past`` wakes a loop at the
next change instead of a poll. ``WatchLoop`` is the loop of a controller built on one."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from scheduler.kubernetes.client import ApiError, KubeClient

log = logging.getLogger("gpupool")


def key(obj: dict) -> str:
    """``namespace/name``, or ``name`` for a cluster-scoped object."""
    meta = obj.get("metadata") or {}
    return f"{meta['namespace']}/{meta.get('name', '')}" if meta.get("namespace") else meta.get("name", "")


class Mirror:
    def __init__(self, kc: KubeClient, Session, paths: dict[str, str], retry_s: float = 2.0,
                 selectors: dict[str, str] | None = None):
        self.kc = kc
        self.Session = Session
        self.paths = paths
        self.selectors = selectors or {}
        self.retry_s = retry_s
        self.objects: dict[str, dict[str, dict]] = {k: {} for k in paths}
        self.synced = dict.fromkeys(paths, False)
        self.version = 0  # moves on at every change seen once every path is listed
        self.lists = 0  # lists made (the first of each path, then one per expired watch)
        self._waiters: list[asyncio.Future] = []
        self._tasks: list[asyncio.Task] = []

    @property
    def ready(self) -> bool:
        """Every path listed: before that, a half copy looks like deletions."""
        return all(self.synced.values())

    def start(self) -> None:
        if not self._tasks:
            self._tasks = [asyncio.ensure_future(self._follow(k)) for k in self.paths]

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []

    def apply(self) -> None:
        """Make the hub's rows match ``objects``."""

    def listed(self, kind: str) -> None:
        """``objects[kind]`` was read again as a whole."""
        self.apply()

    def updated(self, kind: str, old: dict | None, new: dict | None) -> None:
        """One object of ``kind`` changed (``old`` None: added; ``new`` None: deleted)."""
        self.apply()

    async def wait_past(self, version: int, timeout: float | None = None) -> bool:
        """Until ``version`` is passed (a change after it); False when ``timeout`` ends first."""
        if self.version > version:
            return True
        fut = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            # asyncio.wait, not wait_for: on Python 3.11 wait_for can swallow the caller's
            # cancellation when the change arrives at the same moment, and the follower
            # then sleeps on for its whole period
            done, _ = await asyncio.wait({fut}, timeout=timeout)
            return bool(done)
        finally:
            if fut in self._waiters:
                self._waiters.remove(fut)

    def _moved(self) -> None:
        self.version += 1
        for f in self._waiters:
            if not f.done():
                f.set_result(None)
        self._waiters.clear()

    async def _follow(self, kind: str) -> None:
        path = self.paths[kind]
        sel = {"labelSelector": self.selectors[kind]} if kind in self.selectors else {}
        while True:
            try:
                items, rv = await self.kc.list_all(path, **sel)
                self.lists += 1
                self.objects[kind] = {key(o): o for o in items}
                self.synced[kind] = True
                if self.ready:
                    self.listed(kind)
                    self._moved()
                while True:  # a watch ends after its timeout: go on from the last version
                    async for ev in self.kc.watch(path, rv, **sel):
                        obj = ev.get("object") or {}
                        rv = (obj.get("metadata") or {}).get("resourceVersion", rv)
                        if ev["type"] == "BOOKMARK":
                            continue
                        k = key(obj)
                        old = self.objects[kind].get(k)
                        if ev["type"] == "DELETED":
                            self.objects[kind].pop(k, None)
                        else:
                            self.objects[kind][k] = obj
                        if self.ready:
                            self.updated(kind, old, None if ev["type"] == "DELETED" else obj)
                            self._moved()
            except asyncio.CancelledError:
                raise
            except ApiError as e:
                if e.status != 410:  # 410: the version is too old, list again at once
                    log.warning("watching %s: %s", path, e)
                    await asyncio.sleep(self.retry_s)
            except Exception:
                log.exception("watching %s failed", path)
                await asyncio.sleep(self.retry_s)


class WatchLoop:
    """The loop of a hub controller that follows objects through one ``Mirror`` (``pods``):
    ``poll`` at each change and at least every ``poll_s`` (for the hub's own rows, which
    no watch tells of). Subclasses set ``pods`` and ``poll_s`` and define ``poll``."""

    pods: Mirror
    poll_s: float
    _task: asyncio.Task | None = None
    failure = "a controller's poll failed"  # logged with the traceback

    def start(self) -> None:
        if self._task is None:
            self.pods.start()
            self._task = asyncio.ensure_future(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None
        await self.pods.stop()

    async def poll(self) -> None:
        raise NotImplementedError

    async def _loop(self) -> None:
        while True:
            seen = self.pods.version
            try:
                await self.poll()
            except Exception:
                log.exception(self.failure)
            await self.pods.wait_past(seen, self.poll_s)
