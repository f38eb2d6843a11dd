"""The activator: the one HTTP front of every inference service (tornado).

``{prefix}{service}/{path}`` goes to a ready replica of the service; with none ready the
request is held (bounded queue, ``request_timeout_s``) while the controller asks the
scheduler for a replica, and held requests go out in arrival order once one is ready.
Responses stream through chunk by chunk (chunked, server-sent events), never buffered.

Errors are JSON ``{"error": {"status", "field", "message"}}`` like the REST API's:
404 unknown service, 401/403 authentication, 413 body over ``max_body_bytes``,
503 + Retry-After when the queue is full or a held request times out, 502 when a
replica fails after it got the request. A request that a replica cannot have seen
(connection refused, a dead keep-alive connection) is retried on another replica.
"""

from __future__ import annotations

import json
import math
from typing import Protocol

from tornado import iostream, web

from .controller import Controller
from .proxy import NotSent, UpstreamError, forward
from .service import Gone, HoldTimeout, QueueFull, Service

RETRIES = 5
DISCARD_MAX = 1 << 30  # larger bodies are refused before they are read
COOLDOWN_S = 1.0  # a replica that refused a connection is skipped this long


class Authorizer(Protocol):
    """Says who may call a non-public service: None if allowed, else (status, message)."""

    async def check(self, handler: web.RequestHandler, svc: Service) -> tuple[int, str] | None: ...


class ServeHandler(web.RequestHandler):
    SUPPORTED_METHODS = ("GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS")

    def initialize(self, controller: Controller, auth: Authorizer | None):
        self.controller = controller
        self.auth = auth
        self.svc: Service | None = None
        self._body: list[bytes] = []
        self._size = 0
        self._too_big = False
        self._denied: tuple | None = None

    def fail(self, status: int, message: str, field: str | None = None, retry_after: float = 0):
        if self._finished:
            return
        self.clear()
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        if retry_after:
            self.set_header("Retry-After", str(max(1, math.ceil(retry_after))))
        self.finish(json.dumps({"error": {"status": status, "field": field, "message": message}}))

    async def prepare(self):
        # Errors found here are sent once the body is read (``_serve``): a response that
        # finishes before the request body makes tornado drop the connection.
        name = self.path_args[0]
        self.svc = self.controller.services.get(name)
        if self.svc is None:
            known = ", ".join(sorted(self.controller.services)) or "none yet"
            self._denied = (404, f"no inference service named {name!r} (services: {known})",
                            "service")
            return
        if not self.svc.spec.public and self.auth is not None:
            self._denied = await self.auth.check(self, self.svc)
            if self._denied:
                return
        limit = self.svc.spec.max_body_bytes
        length = self.request.headers.get("Content-Length")
        if length is not None and not length.isdigit():
            return self.fail(400, f"bad Content-Length {length!r}", "Content-Length")
        if length is not None and int(length) > DISCARD_MAX:
            return self.fail(413, f"request body of {length} bytes is over this service's "
                             f"limit of {limit} bytes (max_body_bytes)", "body")
        # Read (and drop) a body over the limit so the client sees the 413, not a reset.
        self.request.connection.set_max_body_size(max(limit + 1, int(length or 0)))

    def data_received(self, chunk: bytes):
        if self._denied or self._too_big:
            return
        self._size += len(chunk)
        if self._size > self.svc.spec.max_body_bytes:
            self._too_big = True
            self._body.clear()
        else:
            self._body.append(chunk)

    async def _serve(self, name: str, path: str = ""):
        if self._finished:
            return
        if self._denied:
            return self.fail(*self._denied)
        svc = self.svc
        if self._too_big:
            return self.fail(413, f"request body is over this service's limit of "
                             f"{svc.spec.max_body_bytes} bytes (max_body_bytes)", "body")
        body = b"".join(self._body)
        req = self.request
        uri = "/" + (path or "").lstrip("/")
        if req.query:
            uri += "?" + req.query
        headers = [(k, v) for k, v in req.headers.get_all()
                   if k.lower() not in ("authorization", "cookie")]
        headers.append(("X-Forwarded-For", req.remote_ip or ""))
        svc.begin()
        try:
            for _attempt in range(RETRIES):
                try:
                    r = await svc.acquire()
                except QueueFull as e:
                    return self.fail(503, f"service {name!r} is starting and already holds "
                                     f"{e.args[0]} requests (queue_limit); retry later",
                                     retry_after=5)
                except HoldTimeout as e:
                    why = "; ".join(x.reason for x in svc.replicas if x.reason) or "starting"
                    return self.fail(503, f"no replica of {name!r} became ready within "
                                     f"{e.args[0]:g} s (request_timeout_s): {why}",
                                     retry_after=min(30, svc.spec.request_timeout_s))
                except Gone:
                    return self.fail(404, f"inference service {name!r} was deleted", "service")
                try:
                    await forward(r.pool, req.method, uri, headers, body, self._head, self._chunk)
                    return
                except NotSent as e:  # the replica never saw it: try again (another replica)
                    r.pool.close()  # its other idle connections are likely dead too
                    if e.refused:
                        r.cooldown_until = svc.clock() + COOLDOWN_S
                    continue
                except UpstreamError as e:
                    if self._headers_written:
                        self.request.connection.close()  # cut the client's stream short
                        return
                    return self.fail(502, f"replica {r.name} of {name!r} failed: {e}")
                except iostream.StreamClosedError:
                    return  # the client went away
                finally:
                    r.inflight -= 1
            self.fail(502, f"no replica of {name!r} could take the request after "
                      f"{RETRIES} tries")
        finally:
            svc.end()

    get = post = put = delete = patch = options = head = _serve

    def _head(self, code: int, reason: str, headers: list[tuple[str, str]]) -> None:
        self.set_status(code, reason or None)
        self.clear_header("Content-Type")
        self.clear_header("Server")
        for k, v in headers:
            self.add_header(k, v)

    async def _chunk(self, data: bytes, more: bool) -> None:
        if data:
            self.write(data)
        if more:
            await self.flush()
        elif not self._finished:
            await self.finish()

    def on_connection_close(self):
        self._finished_by_client = True


class BadNameHandler(web.RequestHandler):
    def prepare(self):
        self.set_status(404)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"error": {"status": 404, "field": "service", "message":
                    "no such inference service: names are lowercase letters, digits and '-'"}}))


def routes(controller: Controller, prefix: str = "/", auth: Authorizer | None = None) -> list:
    prefix = prefix if prefix.endswith("/") else prefix + "/"
    args = {"controller": controller, "auth": auth}
    return [(prefix + r"([a-z0-9][a-z0-9-]*)(/.*)?", web.stream_request_body(ServeHandler), args),
            (prefix + r".*", BadNameHandler)]


def make_app(controller: Controller, prefix: str = "/", auth: Authorizer | None = None,
             **settings) -> web.Application:
    return web.Application(routes(controller, prefix, auth), **settings)


__all__ = ["Authorizer", "ServeHandler", "make_app", "routes"]
