"""The activator: the one HTTP front of every inference service.

``{prefix}{service}/{path}`` goes to a ready replica of the service; with none ready the
request is held (bounded queue, ``request_timeout_s``) while the controller asks the
scheduler for a replica, and held requests go out in arrival order once one is ready.
Responses stream through piece by piece (chunked, server-sent events), never buffered;
a slow client pauses the read from the replica (backpressure).

It is an ``asyncio.Protocol`` server with httptools' parser rather than a tornado
application: the activator's CPU per request is what the 50-client latency is made of on
a loaded machine. The fast path -- a ready replica, an idle pooled connection, a
Content-Length response -- runs in parser callbacks without a task, builds the replica's
request head in one formatting step, passes the replica's response head on as it came
when the client can take it (``proxy.Upstream``), writes once per direction and counts
the request in one dict. Holding, auth look-ups and new connections use a task.

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
from .proxy import HOP_BY_HOP, NotSent, Upstream
from .service import Gone, HoldTimeout, QueueFull, Replica, Service

RETRIES = 5
DISCARD_MAX = 1 << 30  # larger bodies are refused before they are read
COOLDOWN_S = 1.0  # a replica that refused a connection, or dropped a request, is skipped this long
PIPELINE_MAX = 32  # requests queued on one client connection before we stop reading
NAME = re.compile(r"[a-z0-9][a-z0-9-]*\Z")
# request headers the replica does not get as sent: hop-by-hop and framing ones (Host and
# Content-Length are set anew), the caller's credentials, and X-Forwarded-For (extended
# with the client's address)
NOT_FORWARDED = HOP_BY_HOP | {b"authorization", b"cookie", b"x-forwarded-for"}
BODY_METHODS = frozenset({b"POST", b"PUT", b"PATCH"})  # Content-Length even when empty
Denial = tuple  # (status, message[, field])


class Authorizer(Protocol):
    """Says who may call a non-public service: None if allowed, else (status, message,
    field); may answer at once or as an awaitable (a token look-up)."""

    def check(self, req: Exchange, svc: Service) -> Denial | None | Awaitable[Denial | None]: ...


LocalRoute = Callable[["Exchange"], tuple[int, str, bytes]]  # -> (code, content type, body)
# A service the controller does not have yet, by name: the one it now has, or None
Lookup = Callable[[str], "Service | None"]


class Server:
    """What every client connection shares: the controller, the prefix, the authorizer.
    ``lookup``: asked for a name the controller does not have before the 404, so that a
    service is served as soon as its submission has answered, whatever the follower's pace."""

    def __init__(self, controller: Controller, prefix: str = "/", auth: Authorizer | None = None,
                 local: dict[str, LocalRoute] | None = None, lookup: Lookup | None = None):
        self.controller = controller
        self.prefix = prefix if prefix.endswith("/") else prefix + "/"
        self.auth = auth
        self.lookup = lookup
        local = {"/metrics": lambda req: (200, "text/plain; version=0.0.4",
                                          metrics.exposition()), **(local or {})}
        self.local = {path.encode(): route for path, route in local.items()}  # by path bytes
        # prefix + a service name, then '/', '?' or the end; group 1 is the name
        self.route = re.compile(re.escape(self.prefix.encode())
                                + rb"([a-z0-9][a-z0-9-]*)(?=[/?]|\Z)").match
        self.servers: list[asyncio.base_events.Server] = []
        metrics.follow(controller)

    def service(self, name: bytes) -> Service | None:
        svc = self.controller.services.get(name.decode())
        if svc is None and self.lookup is not None:
            svc = self.lookup(name.decode())
        return svc

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
        self.xff = b"X-Forwarded-For: \r\n"  # the header line the replica gets (set below)
        self.queue: deque[Exchange] = deque()
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
        self.xff = b"X-Forwarded-For: %b\r\n" % self.peer.encode()

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
        self._forward = b""  # the header lines the replica gets as they are
        self._xff: bytes | None = None  # the client's own X-Forwarded-For
        self._body: list[bytes] | None = None
        self._size = 0
        self._limit = DISCARD_MAX
        self._too_big = False

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name, value))

    def on_headers_complete(self) -> None:
        forward: list[bytes] = []
        length, expect, has_body = None, False, False
        for k, v in self._headers:
            lk = k.lower()
            if lk not in NOT_FORWARDED:
                forward += (k, b": ", v, b"\r\n")
            elif lk == b"content-length":
                length, has_body = v, True
            elif lk == b"transfer-encoding":
                has_body = True
            elif lk == b"expect":
                expect = v.lower() == b"100-continue"
            elif lk == b"x-forwarded-for":
                self._xff = v if self._xff is None else self._xff + b", " + v
        self._forward = b"".join(forward)
        if not has_body and not expect:
            return
        if length is not None and length.isdigit() and int(length) > DISCARD_MAX:
            self.reject(413, f"request body of {int(length)} bytes is over the activator's "
                             f"limit of {DISCARD_MAX} bytes")
            return
        # the service's own limit, when the name is one (checked again when routed)
        m = self.server.route(self._url)
        svc = m and self.server.service(m[1])
        if svc is not None:
            self._limit = svc.spec.max_body_bytes
        if expect and not (length and length.isdigit() and int(length) > self._limit):
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, data: bytes) -> None:
        if self._too_big or self.closed:
            return
        self._size += len(data)
        if self._size > self._limit:  # read and drop it, so the client sees the 413
            self._too_big = True
            self._body = None
        elif self._body is None:
            self._body = [data]
        else:
            self._body.append(data)

    def on_message_complete(self) -> None:
        if self.closed:
            return
        p, body = self.parser, self._body
        ex = Exchange(self, p.get_method(), self._url, self._headers, self._forward, self._xff,
                      b"" if body is None else body[0] if len(body) == 1 else b"".join(body),
                      p.should_keep_alive(), p.get_http_version() == "1.1", self._too_big)
        self._start()
        if self.ex is None and not self.queue:
            self.ex = ex
            ex.start()
            return
        self.queue.append(ex)
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
            self.ex = self.queue.popleft()
            self.ex.start()

    def done(self, ex: Exchange, keep_alive: bool) -> None:
        if self.ex is not ex:
            return
        self.ex = None
        if not keep_alive:
            self.closed = True
            self.transport.close()
        elif self.queue:
            self.next()


class Exchange:
    """One client request on its way through: routing, holding, the replica's response.
    Authorizers and local routes read the request from it (``path``, ``header`` ...)."""

    __slots__ = ("front", "method", "url", "headers", "forward", "xff", "body", "keep_alive",
                 "http11", "too_big", "plain", "svc", "name", "uri", "replica", "up", "task",
                 "tries", "code", "head_sent", "chunked", "finished", "begun", "out")

    def __init__(self, front: Front, method: bytes, url: bytes, headers: list[tuple[bytes, bytes]],
                 forward: bytes, xff: bytes | None, body: bytes, keep_alive: bool, http11: bool,
                 too_big: bool):
        self.front = front
        self.method = method
        self.url = url
        self.headers = headers  # as the client sent them
        self.forward = forward  # the header lines the replica gets as they are
        self.xff = xff
        self.body = body
        self.keep_alive = keep_alive
        self.http11 = http11
        self.too_big = too_big
        # may the replica's own head go to this client unchanged (proxy.Sink)
        self.plain = keep_alive and http11 and method != b"HEAD"
        self.svc: Service | None = None
        self.name = ""
        self.uri = b"/"  # the path and query the replica gets
        self.replica: Replica | None = None
        self.up: Upstream | None = None
        self.task: asyncio.Task | None = None
        self.tries = self.code = 0
        self.head_sent = self.chunked = self.finished = self.begun = False
        self.out: list[bytes] = []  # response bytes of the replica's current read

    # -- the request, as authorizers and local routes read it ------------------------
    @property
    def path(self) -> str:
        return self.url.partition(b"?")[0].decode("latin-1")

    @property
    def query(self) -> str:
        return self.url.partition(b"?")[2].decode("latin-1")

    @property
    def peer(self) -> str:
        return self.front.peer

    def header(self, name: str, default: str = "") -> str:
        key = name.lower().encode()
        for k, v in self.headers:
            if k.lower() == key:
                return v.decode("latin-1")
        return default

    def argument(self, name: str, default: str = "") -> str:
        values = parse_qs(self.query).get(name)
        return values[-1] if values else default

    # -- routing ---------------------------------------------------------------------
    def start(self) -> None:
        server, url = self.front.server, self.url
        m = server.route(url)
        svc = None if m is None else server.service(m[1])
        rest = b"" if m is None else url[m.end():]
        if rest[:1] == b"/":
            self.uri = rest
        else:  # the service's root, or not a service: perhaps a local route (/metrics)
            local = server.local.get(url.partition(b"?")[0])
            if local is not None:
                code, ctype, body = local(self)
                return self.answer(code, ctype.encode(), body)
            if rest:  # a query on the service's root
                self.uri = b"/" + rest
        if svc is None:
            return self._unknown()
        self.svc, self.name = svc, svc.spec.name
        if server.auth is not None and not svc.spec.public:
            verdict = server.auth.check(self, svc)
            if inspect.isawaitable(verdict):
                self.task = asyncio.ensure_future(self._authorize(verdict))
                return
            if verdict:
                return self.fail(*verdict)
        self._admitted()

    def _unknown(self) -> None:
        prefix, path = self.front.server.prefix, self.path
        if not path.startswith(prefix):
            return self.fail(404, f"nothing here: inference services are under {prefix}",
                             "service")
        name = path[len(prefix):].split("/", 1)[0]
        if not NAME.match(name):
            return self.fail(404, "no such inference service: names are lowercase letters, "
                                  "digits and '-'", "service")
        known = ", ".join(sorted(self.front.server.controller.services)) or "none yet"
        self.fail(404, f"no inference service named {name!r} (services: {known})", "service")

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
        svc = self.svc
        if self.too_big:
            return self.fail(413, f"request body is over this service's limit of "
                                  f"{svc.spec.max_body_bytes} bytes (max_body_bytes)", "body")
        if svc.deleted:
            return self.fail(404, f"inference service {self.name!r} was deleted", "service")
        svc.begin()
        self.begun = True
        self._route()

    def _route(self) -> None:
        r = self.svc.pick_now()
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
        """The request as the replica gets it: its path under the service, Host rewritten,
        X-Forwarded-For extended, hop-by-hop headers and credentials dropped."""
        body, method = self.body, self.method
        head = b"%b %b HTTP/1.1\r\nHost: %b\r\n%b%b%b\r\n" % (
            method, self.uri, self.replica.pool.hostport, self.forward,
            self.front.xff if self.xff is None
            else b"X-Forwarded-For: %b, %b\r\n" % (self.xff, self.front.peer.encode()),
            b"Content-Length: %d\r\n" % len(body) if body or method in BODY_METHODS else b"")
        self.up = up
        up.send(self, head, body, reused, method == b"HEAD")

    # -- the replica's response (proxy.Sink) ------------------------------------------
    def on_raw_head(self, code: int, head: bytes) -> None:
        if not self.finished:
            self.code = code
            self.head_sent = True
            self.out.append(head)

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
            if self.http11:
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
        out = self.out
        if out:
            data = out[0] if len(out) == 1 else b"".join(out)
            out.clear()
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
        # The replica may have seen the request, so it is not sent again; until the
        # controller sees why (a replica killed mid-load), others take the next ones.
        r.cooldown_until = self.svc.clock() + COOLDOWN_S
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
        r = self.replica
        if r is not None:
            r.inflight -= 1
            self.replica = None
        if self.begun:
            self.svc.end()
        if self.svc is not None:
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


__all__ = ["Authorizer", "Exchange", "Front", "Server", "error_bytes"]
