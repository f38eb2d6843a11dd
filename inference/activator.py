"""The activator: the one HTTP front of every inference service.

``{prefix}{service}/{path}`` goes to a ready replica of the service; with none ready the
request is held (bounded queue, ``request_timeout_s``) while the controller asks the
scheduler for a replica, and held requests go out in arrival order once one is ready.
Responses stream through piece by piece (chunked, server-sent events), never buffered;
a slow client pauses the read from the replica (backpressure).

It is an ``asyncio.Protocol`` server with httptools' parser rather than a tornado
application: the activator's CPU per request is what the 50-client latency is made of on
a loaded machine, and tornado's request machinery (routing, handler objects, header
objects, a coroutine per request) was most of it. The fast path -- a ready replica and an
idle pooled connection -- runs in callbacks without creating a task; holding, auth
look-ups and new connections use one.

Errors are JSON ``{"error": {"status", "field", "message"}}`` like the REST API's:
404 unknown service, 401/403 authentication, 413 body over ``max_body_bytes``,
503 + Retry-After when the queue is full or a held request times out, 502 when a
replica fails after it got the request. A request that a replica cannot have seen
(connection refused, a dead keep-alive connection) is retried on another replica.
``/metrics`` (Prometheus, ``inference.metrics``) and the ``local`` routes are served at
the root.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import math
import re
import socket
from collections import deque
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from typing import Protocol
from urllib.parse import parse_qs

import httptools

from . import metrics
from .controller import Controller
from .proxy import NotSent, Upstream, request_bytes
from .service import Gone, HoldTimeout, QueueFull, Replica, Service

RETRIES = 5
DISCARD_MAX = 1 << 30  # larger bodies are refused before they are read
COOLDOWN_S = 1.0  # a replica that refused a connection is skipped this long
PIPELINE_MAX = 32  # requests queued on one client connection before we stop reading
NAME = re.compile(r"[a-z0-9][a-z0-9-]*\Z")
DROP_UP = frozenset({b"authorization", b"cookie", b"x-forwarded-for"})
Denial = tuple  # (status, message[, field])


class Request:
    """One client request, complete (its body read)."""

    __slots__ = ("method", "path", "query", "headers", "body", "keep_alive", "http11", "peer",
                 "too_big")

    def __init__(self, method, path, query, headers, body, keep_alive, http11, peer, too_big):
        self.method: bytes = method
        self.path: str = path
        self.query: str = query
        self.headers: list[tuple[bytes, bytes]] = headers
        self.body: bytes = body
        self.keep_alive: bool = keep_alive
        self.http11: bool = http11
        self.peer: str = peer
        self.too_big: bool = too_big

    def header(self, name: str, default: str = "") -> str:
        key = name.lower().encode()
        for k, v in self.headers:
            if k.lower() == key:
                return v.decode("latin-1")
        return default

    def argument(self, name: str, default: str = "") -> str:
        values = parse_qs(self.query).get(name)
        return values[-1] if values else default


class Authorizer(Protocol):
    """Says who may call a non-public service: None if allowed, else (status, message,
    field); may answer at once or as an awaitable (a token look-up)."""

    def check(self, req: Request, svc: Service) -> Denial | None | Awaitable[Denial | None]: ...


LocalRoute = Callable[[Request], tuple[int, str, bytes]]  # -> (code, content type, body)


class Server:
    """What every client connection shares: the controller, the prefix, the authorizer."""

    def __init__(self, controller: Controller, prefix: str = "/", auth: Authorizer | None = None,
                 local: dict[str, LocalRoute] | None = None):
        self.controller = controller
        self.prefix = prefix if prefix.endswith("/") else prefix + "/"
        self.auth = auth
        self.local = {"/metrics": lambda req: (200, "text/plain; version=0.0.4",
                                               metrics.exposition()), **(local or {})}
        self.servers: list[asyncio.base_events.Server] = []
        metrics.follow(controller)

    def protocol(self) -> Front:
        return Front(self)

    async def listen(self, port: int, host: str = "127.0.0.1", reuse_port: bool = False) -> int:
        loop = asyncio.get_running_loop()
        srv = await loop.create_server(self.protocol, host, port, reuse_port=reuse_port or None)
        self.servers.append(srv)
        return srv.sockets[0].getsockname()[1]

    def close(self) -> None:
        for s in self.servers:
            s.close()
        self.servers.clear()


class Front(asyncio.Protocol):
    """One client connection: parses requests and answers them one at a time, in order."""

    def __init__(self, server: Server):
        self.server = server
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.peer = ""
        self.queue: deque[Request] = deque()
        self.ex: Exchange | None = None
        self.closed = False
        self._paused = False
        self._start()

    # -- asyncio ---------------------------------------------------------------------
    def connection_made(self, transport) -> None:
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        peer = transport.get_extra_info("peername")
        self.peer = peer[0] if peer else ""

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self.reject(400, "protocol upgrades (WebSocket) are not supported by the activator")
        except httptools.HttpParserError as e:
            self.reject(400, f"malformed HTTP request: {e}")

    def connection_lost(self, exc) -> None:
        self.closed = True
        self.queue.clear()
        if self.ex is not None:
            self.ex.abort()
            self.ex = None

    def pause_writing(self) -> None:  # the client reads slower than the replica sends
        if self.ex is not None and self.ex.up is not None:
            self.ex.up.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.ex is not None and self.ex.up is not None:
            self.ex.up.transport.resume_reading()

    def reject(self, code: int, message: str) -> None:
        """A request we cannot even parse: answer and close."""
        if not self.closed and self.ex is None:
            self.transport.write(error_bytes(code, message, None, keep_alive=False))
        self.closed = True
        self.transport.close()

    # -- httptools -------------------------------------------------------------------
    def _start(self) -> None:
        self._url = b""
        self._headers: list[tuple[bytes, bytes]] = []
        self._body: list[bytes] = []
        self._size = 0
        self._limit = DISCARD_MAX
        self._too_big = False

    def on_message_begin(self) -> None:
        self._start()

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name, value))

    def on_headers_complete(self) -> None:
        length, expect = None, False
        for k, v in self._headers:
            lk = k.lower()
            if lk == b"content-length":
                length = v
            elif lk == b"expect":
                expect = v.lower() == b"100-continue"
        if length is not None and length.isdigit() and int(length) > DISCARD_MAX:
            self.reject(413, f"request body of {int(length)} bytes is over the activator's "
                             f"limit of {DISCARD_MAX} bytes")
            return
        # the service's own limit, when the name is one (a cheap look-up; checked again later)
        rest = self._url.split(b"?", 1)[0].decode("latin-1")
        if rest.startswith(self.server.prefix):
            svc = self.server.controller.services.get(rest[len(self.server.prefix):].split("/", 1)[0])
            if svc is not None:
                self._limit = svc.spec.max_body_bytes
        if expect and not (length and int(length) > self._limit):
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, data: bytes) -> None:
        if self._too_big or self.closed:
            return
        self._size += len(data)
        if self._size > self._limit:  # read and drop it, so the client sees the 413
            self._too_big = True
            self._body.clear()
        else:
            self._body.append(data)

    def on_message_complete(self) -> None:
        if self.closed:
            return
        p = self.parser
        path, _, query = self._url.decode("latin-1").partition("?")
        body = self._body[0] if len(self._body) == 1 else b"".join(self._body)
        self.queue.append(Request(p.get_method(), path, query, self._headers, body,
                                  p.should_keep_alive(), p.get_http_version() == "1.1",
                                  self.peer, self._too_big))
        self._start()
        if self.ex is None:
            self.next()
        elif len(self.queue) >= PIPELINE_MAX and not self._paused:
            self._paused = True
            self.transport.pause_reading()

    # -- exchanges -------------------------------------------------------------------
    def next(self) -> None:
        while self.ex is None and self.queue and not self.closed:
            if self._paused and len(self.queue) < PIPELINE_MAX // 2:
                self._paused = False
                self.transport.resume_reading()
            self.ex = Exchange(self, self.queue.popleft())
            self.ex.start()

    def done(self, ex: Exchange, keep_alive: bool) -> None:
        if self.ex is not ex:
            return
        self.ex = None
        if not keep_alive:
            self.closed = True
            self.transport.close()
        else:
            self.next()


class Exchange:
    """One request on its way through: routing, holding, the replica's response."""

    __slots__ = ("front", "req", "svc", "name", "replica", "up", "task", "tries", "code",
                 "head_sent", "chunked", "keep_alive", "finished", "begun", "out")

    def __init__(self, front: Front, req: Request):
        self.front = front
        self.req = req
        self.svc: Service | None = None
        self.name = ""
        self.replica: Replica | None = None
        self.up: Upstream | None = None
        self.task: asyncio.Task | None = None
        self.tries = 0
        self.code = 0
        self.head_sent = self.chunked = self.finished = self.begun = False
        self.keep_alive = req.keep_alive
        self.out: list[bytes] = []  # response bytes of the replica's current read

    # -- routing ---------------------------------------------------------------------
    def start(self) -> None:
        server, req = self.front.server, self.req
        local = server.local.get(req.path)
        if local is not None:
            code, ctype, body = local(req)
            return self.answer(code, ctype.encode(), body)
        if not req.path.startswith(server.prefix):
            return self.fail(404, f"nothing here: inference services are under {server.prefix}",
                             "service")
        name = req.path[len(server.prefix):].split("/", 1)[0]
        if not NAME.match(name):
            return self.fail(404, "no such inference service: names are lowercase letters, "
                                  "digits and '-'", "service")
        self.name = name
        svc = self.svc = server.controller.services.get(name)
        if svc is None:
            known = ", ".join(sorted(server.controller.services)) or "none yet"
            return self.fail(404, f"no inference service named {name!r} (services: {known})",
                             "service")
        if not svc.spec.public and server.auth is not None:
            verdict = server.auth.check(req, svc)
            if inspect.isawaitable(verdict):
                self.task = asyncio.ensure_future(self._authorize(verdict))
                return
            if verdict:
                return self.fail(*verdict)
        self._admitted()

    async def _authorize(self, verdict: Awaitable) -> None:
        try:
            denied = await verdict
        except Exception as e:  # the hub did not answer: say so, don't hang
            return self.fail(503, f"cannot check the token with the hub: {e}", retry_after=5)
        if self.finished:
            return
        if denied:
            return self.fail(*denied)
        self._admitted()

    def _admitted(self) -> None:
        svc, req = self.svc, self.req
        if req.too_big:
            return self.fail(413, f"request body is over this service's limit of "
                                  f"{svc.spec.max_body_bytes} bytes (max_body_bytes)", "body")
        if svc.deleted:
            return self.fail(404, f"inference service {self.name!r} was deleted", "service")
        svc.begin()
        self.begun = True
        self._route()

    def _route(self) -> None:
        svc = self.svc
        r = svc.pick_now()
        if r is not None:
            self._send(r)
        else:
            self.task = asyncio.ensure_future(self._hold())

    async def _hold(self) -> None:
        svc, name = self.svc, self.name
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
        if self.finished:  # the client went away while held
            r.inflight -= 1
            return
        self._send(r)

    def _send(self, r: Replica) -> None:
        self.replica = r
        up = r.pool.take()
        if up is None:
            self.task = asyncio.ensure_future(self._connect(r))
        else:
            self._write(up, True)

    async def _connect(self, r: Replica) -> None:
        try:
            up = await r.pool.connect()
        except NotSent as e:
            return self.on_error(e)
        if self.finished:
            r.pool.put(up)
            return
        self._write(up, False)

    def _write(self, up: Upstream, reused: bool) -> None:
        req = self.req
        path = req.path[len(self.front.server.prefix) + len(self.name):] or "/"
        uri = (path + "?" + req.query if req.query else path).encode("latin-1")
        fwd = [(k, v) for k, v in req.headers if k.lower() not in DROP_UP]
        xff = req.header("X-Forwarded-For")
        fwd.append((b"X-Forwarded-For", (f"{xff}, {req.peer}" if xff else req.peer).encode()))
        self.up = up
        up.send(self, request_bytes(self.replica.pool, req.method, uri, fwd, req.body),
                reused, head=req.method == b"HEAD")

    # -- the replica's response (proxy.Sink) ------------------------------------------
    def on_head(self, code, reason, headers, length, bodyless) -> None:
        if self.finished:
            return
        self.code = code
        self.head_sent = True
        out = [b"HTTP/1.1 %d " % code, reason or _reason(code), b"\r\n"]
        for k, v in headers:
            out += (k, b": ", v, b"\r\n")
        if length is not None:
            out += (b"Content-Length: ", length, b"\r\n")
        elif not bodyless:
            if self.req.http11:
                self.chunked = True
                out.append(b"Transfer-Encoding: chunked\r\n")
            else:
                self.keep_alive = False  # an HTTP/1.0 client: the close ends the body
        if not self.keep_alive:
            out.append(b"Connection: close\r\n")
        out.append(b"\r\n")
        self.out.append(b"".join(out))

    def on_body(self, data: bytes) -> None:
        if self.finished or not data:
            return
        if self.chunked:
            self.out.append(b"%x\r\n%b\r\n" % (len(data), data))
        else:
            self.out.append(data)

    def flush(self) -> None:
        """Send what one read from the replica gave: head and body in one write."""
        if self.out:
            data = self.out[0] if len(self.out) == 1 else b"".join(self.out)
            self.out.clear()
            if not self.finished:
                self.front.transport.write(data)

    def on_done(self) -> None:
        if self.finished:
            return
        if self.chunked:
            self.out.append(b"0\r\n\r\n")
        self.flush()
        self.up = None
        self._finish()

    def on_error(self, exc: ConnectionError) -> None:
        r, self.up = self.replica, None
        if self.finished:
            return
        if isinstance(exc, NotSent):  # the replica never saw it: try again (another replica)
            r.inflight -= 1
            self.replica = None
            r.pool.close()  # its other idle connections are likely dead too
            if exc.refused:
                r.cooldown_until = self.svc.clock() + COOLDOWN_S
            self.tries += 1
            if self.tries >= RETRIES:
                return self.fail(502, f"no replica of {self.name!r} could take the request "
                                      f"after {RETRIES} tries")
            return self._route()
        if self.head_sent:  # cut the client's stream short
            self.flush()
            self.keep_alive = False
            return self._finish()
        self.fail(502, f"replica {r.name} of {self.name!r} failed: {exc}")

    # -- answers ---------------------------------------------------------------------
    def fail(self, code: int, message: str, field: str | None = None,
             retry_after: float = 0) -> None:
        if self.finished:
            return
        self.code = code
        self.front.transport.write(error_bytes(code, message, field, self.keep_alive,
                                               retry_after))
        self._finish()

    def answer(self, code: int, ctype: bytes, body: bytes) -> None:
        self.code = code
        self.front.transport.write(b"HTTP/1.1 %d %b\r\nContent-Type: %b\r\nContent-Length: "
                                   b"%d\r\n%b\r\n%b" % (code, _reason(code), ctype, len(body),
                                                        _close(self.keep_alive), body))
        self._finish()

    def _finish(self) -> None:
        self.finished = True
        if self.replica is not None:
            self.replica.inflight -= 1
            self.replica = None
        if self.begun:
            self.svc.end()
        if self.name and self.svc is not None:
            metrics.count(self.name, self.code)
        self.front.done(self, self.keep_alive)

    def abort(self) -> None:
        """The client went away."""
        if self.finished:
            return
        if self.task is not None and not self.task.done():
            self.task.cancel()
        if self.up is not None:
            self.up.abort()  # mid-response: that connection cannot be reused
            self.up = None
        self.code = self.code or 499
        self.keep_alive = False
        self._finish()


def _reason(code: int) -> bytes:
    try:
        return HTTPStatus(code).phrase.encode()
    except ValueError:
        return b"Unknown"


def _close(keep_alive: bool) -> bytes:
    return b"" if keep_alive else b"Connection: close\r\n"


def error_bytes(code: int, message: str, field: str | None, keep_alive: bool,
                retry_after: float = 0) -> bytes:
    body = json.dumps({"error": {"status": code, "field": field, "message": message}}).encode()
    retry = b"Retry-After: %d\r\n" % max(1, math.ceil(retry_after)) if retry_after else b""
    return (b"HTTP/1.1 %d %b\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%b%b\r\n%b"
            % (code, _reason(code), len(body), retry, _close(keep_alive), body))


__all__ = ["Authorizer", "Exchange", "Front", "Request", "Server", "error_bytes"]
