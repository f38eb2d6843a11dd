"""The loop that keeps each service at the autoscaler's count: every tick it closes a
metering period, asks the autoscaler, and starts or stops replicas through a backend.
A request held at zero replicas reconciles at once instead of waiting for the tick.

Stopping a replica: it leaves routing first, its requests in flight finish (up to the
service's request timeout), then the backend stops it and its GPU share goes back.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Callable
from typing import Protocol

from .autoscaler import IdleLimit
from .contract import ServiceSpec
from .service import Replica, RState, Service

log = logging.getLogger("gpupool.inference")


class Backend(Protocol):
    """Runs replicas. ``start`` returns at once; the backend then reports through
    ``service.replica_ready`` / ``service.replica_gone`` and ``replica.reason``."""

    def start(self, service: Service, replica: Replica) -> None: ...
    async def stop(self, service: Service, replica: Replica) -> None: ...


class Controller:
    def __init__(self, backend: Backend, tick_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic, held: bool = False):
        """``held``: services added before ``start`` wait for it to be reconciled, so that
        replicas a backend adopts meanwhile are counted first."""
        self.held = held
        self.backend = backend
        self.tick_s = tick_s
        self.clock = clock
        self.services: dict[str, Service] = {}
        self.on_change: Callable[[Service], None] = lambda s: None
        self._task: asyncio.Task | None = None
        self._busy: set[str] = set()
        self._again: set[str] = set()

    # -- services ----------------------------------------------------------------------
    def put(self, spec: ServiceSpec, idle_limit: IdleLimit | None = None) -> Service:
        """Add or update a service; ``idle_limit``: its project's policy's (the hub's
        ``inference.idle.idle_limits``)."""
        svc = self.services.get(spec.name)
        if svc is None:
            svc = self.services[spec.name] = Service(spec, self.clock, self.activate, idle_limit)
        elif svc.spec != spec or svc.autoscaler.policy.idle_limit != idle_limit:
            restart = (svc.spec.command, svc.spec.gpu, svc.spec.env, svc.spec.image) != (
                spec.command, spec.gpu, spec.env, spec.image)
            svc.spec = spec
            svc.autoscaler.policy = svc.autoscaler.policy.of(spec, idle_limit)
            if restart:  # new replicas with the new spec; the old ones drain and stop
                for r in list(svc.live()):
                    asyncio.ensure_future(self._stop(svc, r))
        self.activate(svc)
        return svc

    def adopt(self, spec: ServiceSpec, name: str, row, idle_limit: IdleLimit | None = None) -> bool:
        """Put replica ``name`` (workload ``row``), which outlived a hub restart, back in
        its service, before the service's first reconcile counts what runs. A backend
        that can adopt (the embedded one) says whether it still runs."""
        svc = self.put(spec, idle_limit)
        r = Replica(name, spec.name)
        if not self.backend.adopt(svc, r, row):
            return False
        svc.replicas.append(r)
        return True

    async def remove(self, name: str) -> None:
        from .service import Gone

        svc = self.services.pop(name, None)
        if svc is None:
            return
        svc.deleted = True
        svc.fail_held(Gone(name))
        await asyncio.gather(*(self._stop(svc, r) for r in list(svc.replicas)))

    # -- loop --------------------------------------------------------------------------
    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.ensure_future(self._loop())
        if self.held:
            self.held = False
            for svc in self.services.values():
                self.activate(svc)

    async def stop(self, keep_replicas: bool = False) -> None:
        """Stop the loop and every service: their held requests fail. ``keep_replicas``: the
        replicas keep running, for the next controller to adopt (the backend's ``release``
        stops following them); else they are stopped."""
        from .service import Gone

        if self._task:
            self._task.cancel()
            self._task = None
        if keep_replicas:
            release = getattr(self.backend, "release", None)
            for name, svc in list(self.services.items()):
                svc.deleted = True
                svc.fail_held(Gone(name))
                for r in svc.live():
                    if release is not None:
                        release(svc, r)
            self.services.clear()
            return
        for name in list(self.services):
            await self.remove(name)

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.tick_s)
            for svc in list(self.services.values()):
                try:
                    svc.sample()
                    await self.reconcile(svc)
                except Exception:
                    log.exception("autoscaling %s failed", svc.spec.name)

    def activate(self, svc: Service) -> None:
        if not self.held:
            asyncio.ensure_future(self.reconcile(svc))

    async def reconcile(self, svc: Service) -> None:
        name = svc.spec.name
        if name in self._busy:
            self._again.add(name)
            return
        self._busy.add(name)
        try:
            while True:
                self._again.discard(name)
                self._reconcile_once(svc)
                if name not in self._again:
                    break
        finally:
            self._busy.discard(name)
        self.on_change(svc)

    def _reconcile_once(self, svc: Service) -> None:
        if svc.deleted:
            return
        want = svc.recommend().replicas
        live = svc.live()
        for _ in range(want - len(live)):
            r = Replica(f"{svc.spec.name}-{secrets.token_hex(3)}", svc.spec.name)
            svc.replicas.append(r)
            self.backend.start(svc, r)
        if len(live) > want:
            # least useful first: not placed, then still starting, then the least loaded
            order = {RState.PENDING: 0, RState.STARTING: 1, RState.READY: 2}
            extra = sorted(live, key=lambda r: (order[r.state], r.inflight))[: len(live) - want]
            for r in extra:
                asyncio.ensure_future(self._stop(svc, r))

    async def _stop(self, svc: Service, r: Replica) -> None:
        if r.state in (RState.STOPPED, RState.FAILED):
            return
        r.state, r.reason = RState.STOPPING, "scaling down"
        deadline = self.clock() + svc.spec.request_timeout_s
        while r.inflight > 0 and self.clock() < deadline:
            await asyncio.sleep(0.05)
        try:
            await self.backend.stop(svc, r)
        finally:
            svc.replica_gone(r, RState.STOPPED, "scaled down")
            self.on_change(svc)


__all__ = ["Backend", "Controller"]
