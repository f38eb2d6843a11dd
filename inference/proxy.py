"""The activator's hop to a replica: keep-alive HTTP/1.1 connections pooled per replica,
each an ``asyncio.Protocol`` with httptools' response parser, the response handed to a
sink piece by piece as it arrives (never buffered whole).

Why not tornado's client or asyncio streams: profiled under 50 keep-alive clients on the
shared 2-core machine, a coroutine per request and a ``readline`` await per header line
cost more CPU than the rest of the activator; callbacks on a protocol do the same work in
a fraction of it (see bench/activator.py, ``activator_cpu_us_per_req``).

Errors reach the sink's ``on_error``: ``NotSent`` means the replica cannot have seen the
request (connect refused, or a pooled connection found closed before any byte of a
response): the caller may retry it on another replica. ``UpstreamError`` means it may
have been seen: the caller answers 502 (or cuts a response already under way).
"""

from __future__ import annotations

import asyncio
import socket
from typing import Protocol

import httptools

HOP_BY_HOP = frozenset({
    b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"te",
    b"trailer", b"transfer-encoding", b"upgrade", b"host", b"content-length", b"expect",
})


class NotSent(ConnectionError):
    """The replica did not get the request; safe to retry elsewhere. ``refused``: the
    replica is not listening (down or not yet up), not just a stale connection."""

    def __init__(self, message: str, refused: bool = False):
        super().__init__(message)
        self.refused = refused


class UpstreamError(ConnectionError):
    """The replica failed after it may have got the request."""


class Sink(Protocol):
    """Where one response goes (the activator's exchange)."""

    def on_head(self, code: int, reason: bytes, headers: list[tuple[bytes, bytes]],
                length: bytes | None, bodyless: bool) -> None: ...
    def on_body(self, data: bytes) -> None: ...
    def flush(self) -> None: ...  # the end of one read: send what head and body gave
    def on_done(self) -> None: ...
    def on_error(self, exc: ConnectionError) -> None: ...


class Upstream(asyncio.Protocol):
    """One keep-alive connection to a replica, carrying one request at a time."""

    def __init__(self, pool: Pool):
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.sink: Sink | None = None
        self.closed = False
        self._got = self._reused = self._head = self._until_close = False
        self._reason = b""
        self._headers: list[tuple[bytes, bytes]] = []

    # -- use -------------------------------------------------------------------------
    def send(self, sink: Sink, data: bytes, reused: bool, head: bool = False) -> None:
        self.sink, self._reused, self._head = sink, reused, head
        self._got = self._until_close = False
        self.transport.write(data)

    def abort(self) -> None:
        """Drop the connection mid-exchange (the client went away): no more callbacks."""
        self.sink = None
        self.transport.close()

    # -- asyncio ---------------------------------------------------------------------
    def connection_made(self, transport) -> None:
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        if self.sink is None:  # bytes nobody asked for: this connection is not reusable
            self.transport.close()
            return
        self._got = True
        sink = self.sink
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as e:
            self._fail(UpstreamError(f"bad response from the replica: {e}"))
        sink.flush()  # one write to the client per read from the replica

    def connection_lost(self, exc) -> None:
        self.closed = True
        sink, self.sink = self.sink, None
        if sink is None:
            return
        if self._until_close:  # a body delimited by the close: it is complete now
            sink.on_done()
        elif not self._got:
            if self._reused:  # the replica closed an idle connection (or died) before our write
                sink.on_error(NotSent("stale connection"))
            else:
                sink.on_error(UpstreamError("replica closed the connection without answering"))
        else:
            sink.on_error(UpstreamError("replica closed the connection mid-response"))

    def _fail(self, exc: ConnectionError) -> None:
        sink, self.sink = self.sink, None
        self.transport.close()
        if sink is not None:
            sink.on_error(exc)

    # -- httptools -------------------------------------------------------------------
    def on_message_begin(self) -> None:
        self._headers = []
        self._reason = b""

    def on_status(self, reason: bytes) -> None:
        self._reason += reason

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name, value))

    def on_headers_complete(self) -> None:
        code = self.parser.get_status_code()
        length, chunked, headers = None, False, []
        for k, v in self._headers:
            lk = k.lower()
            if lk == b"content-length":
                length = v
            elif lk == b"transfer-encoding":
                chunked = b"chunked" in v.lower()
            elif lk not in HOP_BY_HOP:
                headers.append((k, v))
        bodyless = self._head or code in (204, 304) or 100 <= code < 200
        if not bodyless and length is None and not chunked:
            self._until_close = True
        if self.sink is not None:
            self.sink.on_head(code, self._reason, headers, length, bodyless)
        if self._head:  # the parser cannot know there is no body: finish here, don't reuse
            sink, self.sink = self.sink, None
            self.transport.close()
            if sink is not None:
                sink.on_done()

    def on_body(self, data: bytes) -> None:
        if self.sink is not None:
            self.sink.on_body(data)

    def on_message_complete(self) -> None:
        sink, self.sink = self.sink, None
        if sink is None:
            return
        if self.parser.should_keep_alive() and not self.closed:
            self.pool.put(self)
        else:
            self.transport.close()
        sink.on_done()


class Pool:
    """Idle keep-alive connections to one replica."""

    def __init__(self, host: str, port: int, size: int = 256):
        self.host, self.port, self.size = host, port, size
        self.idle: list[Upstream] = []
        self.hostport = f"{host}:{port}".encode()

    def take(self) -> Upstream | None:
        while self.idle:
            u = self.idle.pop()
            if not u.closed and not u.transport.is_closing():
                return u
        return None

    async def connect(self) -> Upstream:
        loop = asyncio.get_running_loop()
        try:
            _, u = await loop.create_connection(lambda: Upstream(self), self.host, self.port)
        except OSError as e:
            raise NotSent(f"cannot connect to {self.host}:{self.port}: {e}", refused=True) from None
        return u

    def put(self, u: Upstream) -> None:
        if len(self.idle) < self.size:
            self.idle.append(u)
        else:
            u.transport.close()

    def close(self) -> None:
        for u in self.idle:
            u.transport.close()
        self.idle.clear()


def request_bytes(pool: Pool, method: bytes, uri: bytes, headers: list[tuple[bytes, bytes]],
                  body: bytes) -> bytes:
    """The request as the replica gets it: hop-by-hop headers dropped, Host rewritten."""
    out = [method, b" ", uri, b" HTTP/1.1\r\nHost: ", pool.hostport, b"\r\n"]
    for k, v in headers:
        if k.lower() not in HOP_BY_HOP:
            out += (k, b": ", v, b"\r\n")
    if body or method in (b"POST", b"PUT", b"PATCH"):
        out.append(b"Content-Length: %d\r\n" % len(body))
    out.append(b"\r\n")
    out.append(body)
    return b"".join(out)


__all__ = ["NotSent", "Pool", "Sink", "Upstream", "UpstreamError", "request_bytes"]
