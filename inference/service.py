"""The live state of one inference service: its replicas, the requests held while none
is ready, and the load meter the autoscaler reads.

Routing: a request goes to the ready replica with the fewest requests in flight. While
requests are held, new ones queue behind them, so held requests are released in arrival
order once a replica is ready.
"""

from __future__ import annotations

import asyncio
import enum
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpupool.errors import GpupoolError

from . import metrics
from .autoscaler import Autoscaler, IdleLimit, Policy, Recommendation
from .contract import ServiceSpec
from .proxy import Pool


class QueueFull(GpupoolError):
    pass


class HoldTimeout(GpupoolError):
    pass


class Gone(GpupoolError):
    """The service was deleted while the request waited."""


class RState(str, enum.Enum):
    PENDING = "pending"  # asked of the scheduler, not placed yet
    STARTING = "starting"  # placed; the model server is starting
    READY = "ready"
    STOPPING = "stopping"  # draining its requests, then stopped
    FAILED = "failed"
    STOPPED = "stopped"


LIVE = (RState.PENDING, RState.STARTING, RState.READY)
READY = RState.READY


@dataclass(eq=False)
class Replica:
    name: str
    service: str
    state: RState = RState.PENDING
    reason: str = "waiting for the scheduler"
    host: str = ""
    port: int = 0
    socket: str = ""  # a unix socket's path, instead of host and port
    where: str = ""  # node and GPU, once placed
    inflight: int = 0
    cooldown_until: float = 0.0  # refused a connection: not routed to until then
    created: float = field(default_factory=time.time)
    pool: Pool | None = None
    handle: Any = None  # the backend's

    def endpoint(self) -> str:
        return f"unix:{self.socket}" if self.socket else f"{self.host}:{self.port}" if self.port else ""

    def to_dict(self) -> dict:
        return {"name": self.name, "state": self.state.value, "reason": self.reason,
                "placement": self.where, "endpoint": self.endpoint(),
                "in_flight": self.inflight, "created": self.created}


class Service:
    def __init__(self, spec: ServiceSpec, clock: Callable[[], float] = time.monotonic,
                 on_activate: Callable[[Service], None] = lambda s: None,
                 idle_limit: IdleLimit | None = None):
        self.spec = spec
        self.clock = clock
        self.on_activate = on_activate
        self.replicas: list[Replica] = []
        self.history: deque[Replica] = deque(maxlen=10)  # recently failed or stopped
        self.held: deque[asyncio.Future] = deque()
        self.autoscaler = Autoscaler(Policy.of(spec, idle_limit), clock())
        self.last: Recommendation | None = None
        # the last scale to zero by the policy's idle limit: {ts (wall clock), message}
        self.idle_stop: dict | None = None
        self.deleted = False
        self._rr = 0
        self.cold_since: float | None = None  # first request held while none was ready
        # meter
        self.inflight = 0
        self.total = 0
        self._integral = 0.0
        self._mark = self._sample_mark = clock()
        self._requests = 0

    # -- routing -----------------------------------------------------------------------
    def ready(self) -> list[Replica]:
        return [r for r in self.replicas if r.state == RState.READY]

    def live(self) -> list[Replica]:
        return [r for r in self.replicas if r.state in LIVE]

    def _pick(self) -> Replica | None:
        """The ready replica with the fewest requests in flight (ties taken in turn),
        counted; one that refused a connection lately only when no other is ready."""
        reps = self.replicas
        n = len(reps)
        if not n:
            return None
        self._rr = first = (self._rr + 1) % n
        best = cooling = None
        now = 0.0
        for i in range(first, first + n):
            r = reps[i % n]
            if r.state is not READY:
                continue
            if r.cooldown_until:
                now = now or self.clock()
                if r.cooldown_until > now:
                    if cooling is None or r.inflight < cooling.inflight:
                        cooling = r
                    continue
            if best is None or r.inflight < best.inflight:
                best = r
        best = best or cooling
        if best is not None:
            best.inflight += 1
        return best

    def pick_now(self) -> Replica | None:
        """A ready replica at once (counted), or None: the request must wait in order."""
        if self.held or self.deleted:
            return None
        return self._pick()

    async def acquire(self) -> Replica:
        """A ready replica with this request counted on it; holds the request while none
        is ready. Raises QueueFull, HoldTimeout or Gone."""
        if self.deleted:
            raise Gone(self.spec.name)
        if not self.held:
            r = self._pick()
            if r is not None:
                return r
        if len(self.held) >= self.spec.queue_limit:
            raise QueueFull(self.spec.queue_limit)
        fut = asyncio.get_running_loop().create_future()
        if self.cold_since is None and not self.ready():
            self.cold_since = self.clock()
        self.held.append(fut)
        self.on_activate(self)
        try:
            return await asyncio.wait_for(asyncio.shield(fut), self.spec.request_timeout_s)
        except asyncio.TimeoutError:
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                return fut.result()
            fut.cancel()
            raise HoldTimeout(self.spec.request_timeout_s) from None
        finally:
            try:
                self.held.remove(fut)
            except ValueError:
                pass

    def release_held(self) -> None:
        """Hand held requests, oldest first, to ready replicas."""
        while self.held:
            fut = self.held[0]
            if fut.done():
                self.held.popleft()
                continue
            r = self._pick()
            if r is None:
                return
            self.held.popleft()
            fut.set_result(r)

    def fail_held(self, exc: Exception) -> None:
        self.cold_since = None
        while self.held:
            fut = self.held.popleft()
            if not fut.done():
                fut.set_exception(exc)

    def replica_ready(self, r: Replica, host: str, port: int, socket: str = "") -> None:
        r.host, r.port, r.socket, r.state, r.reason = host, port, socket, RState.READY, ""
        r.pool = Pool(host, port, socket=socket)
        if self.cold_since is not None:
            metrics.cold_start(self.spec.name, self.clock() - self.cold_since)
            self.cold_since = None
        self.release_held()

    def replica_gone(self, r: Replica, state: RState, reason: str) -> None:
        r.state, r.reason = state, reason
        if r.pool is not None:
            r.pool.close()
        if r in self.replicas:
            self.replicas.remove(r)
            self.history.append(r)

    # -- meter -------------------------------------------------------------------------
    def _advance(self) -> None:
        now = self.clock()
        self._integral += self.inflight * (now - self._mark)
        self._mark = now

    def begin(self) -> None:
        now = self.clock()  # _advance, inline: this runs per request
        self._integral += self.inflight * (now - self._mark)
        self._mark = now
        self.inflight += 1
        self._requests += 1
        self.total += 1
        self.autoscaler.request_seen(now)

    def end(self) -> None:
        now = self.clock()
        self._integral += self.inflight * (now - self._mark)
        self._mark = now
        self.inflight -= 1

    def sample(self) -> None:
        """Close one metering period and give it to the autoscaler."""
        self._advance()
        now = self._mark
        dt = max(now - self._sample_mark, 1e-9)
        concurrency = self._integral / dt
        value = concurrency if self.spec.metric == "concurrency" else self._requests / dt
        self.autoscaler.observe(now, value, self._requests)
        self._integral, self._requests, self._sample_mark = 0.0, 0, now

    def recommend(self) -> Recommendation:
        live = len(self.live())
        rec = self.autoscaler.recommend(self.clock(), live, self.inflight, len(self.held))
        lim = self.autoscaler.policy.idle_limit
        if rec.idle_limited and live and lim and not (self.last and self.last.idle_limited):
            self.idle_stop = {"ts": time.time(), "message": (
                f"{self.spec.name} scaled to zero from {live} replica{'s' if live > 1 else ''}: no "
                f"request for longer than the idle timeout of an inference service ({lim.seconds:g} s, "
                f"{lim.policy}); the next request starts it again")}
        self.last = rec
        return rec

    def status(self) -> dict:
        rec = self.last
        return {
            "ready": len(self.ready()), "replicas": len(self.live()),
            "desired": rec.replicas if rec else 0, "panic": bool(rec and rec.panic),
            "why": rec.why if rec else "", "in_flight": self.inflight, "held": len(self.held),
            "requests_total": self.total,
            "replica_list": [r.to_dict() for r in self.replicas],
            "recent": [r.to_dict() for r in self.history],
            "idle_stop": self.idle_stop,
        }


__all__ = ["Gone", "HoldTimeout", "QueueFull", "RState", "Replica", "Service"]
