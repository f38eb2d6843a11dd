"""The activator's hop to a replica: keep-alive HTTP/1.1 connections pooled per replica,
each an ``asyncio.Protocol`` with httptools' response parser, the response handed to a
sink piece by piece as it arrives (never buffered whole).

Why not tornado's client or asyncio streams: profiled under 50 keep-alive clients on the
shared 2-core machine, a coroutine per request and a ``readline`` await per header line
cost more CPU than the rest of the activator; callbacks on a protocol do the same work in
a fraction of it (see bench/activator.py, ``activator_cpu_us_per_req``).

The response head is not taken apart header by header: the parser validates it (strict
CRLF framing, one Content-Length), and its bytes are then read as they came. A head the
client can take as it is -- HTTP/1.1, framed by Content-Length, no hop-by-hop header --
goes to the client unchanged (``Sink.on_raw_head``); any other is split into headers and
rebuilt by the sink (``Sink.on_head``: hop-by-hop headers dropped, chunked or close framing
for the client).

Errors reach the sink's ``on_error``: ``NotSent`` means the replica cannot have seen the
request (connect refused, or a pooled connection found closed before any byte of a
response): the caller may retry it on another replica. ``UpstreamError`` means it may
have been seen: the caller answers 502 (or cuts a response already under way).
"""

from __future__ import annotations

import asyncio
import re
import socket
from typing import Protocol

import httptools

from gpupool.errors import GpupoolError

# headers that describe one hop, not the message: never passed on in either direction
# (Host and Content-Length are set anew for the next hop)
HOP_BY_HOP = frozenset({
    b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"te",
    b"trailer", b"transfer-encoding", b"upgrade", b"host", b"content-length", b"expect",
})
# any of them in a response head: (name as it occurs, value); the parser validated the head
_HOP_IN_HEAD = re.compile(rb"\r\n(" + b"|".join(re.escape(h) for h in sorted(HOP_BY_HOP))
                          + rb"):[ \t]*([^\r\n]*)", re.IGNORECASE)


class NotSent(GpupoolError, ConnectionError):
    """The replica did not get the request; safe to retry elsewhere. ``refused``: the
    replica is not listening (down or not yet up), not just a stale connection."""

    def __init__(self, message: str, refused: bool = False):
        super().__init__(message)
        self.refused = refused


class UpstreamError(GpupoolError, ConnectionError):
    """The replica failed after it may have got the request."""


class Sink(Protocol):
    """Where one response goes (the activator's exchange)."""

    plain: bool  # the client may take an HTTP/1.1 keep-alive Content-Length head as it is

    def on_raw_head(self, code: int, head: bytes) -> None: ...  # only when ``plain``; may
    # hold the whole response (then no on_body follows)
    def on_head(self, code: int, reason: bytes, headers: list[tuple[bytes, bytes]],
                length: bytes | None, bodyless: bool) -> None: ...  # hop-by-hop ones removed
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
        self._got = self._reused = self._head_only = self._until_close = False
        self._raw: bytes | None = None  # the response so far, until its head is complete
        self._whole = False  # the sink got the whole response with its head: skip the body

    # -- use -------------------------------------------------------------------------
    def send(self, sink: Sink, head: bytes, body: bytes, reused: bool,
             head_only: bool = False) -> None:
        self.sink, self._reused, self._head_only = sink, reused, head_only
        self._got = self._until_close = self._whole = False
        self._raw = b""
        if body:
            self.transport.writelines((head, body))
        else:
            self.transport.write(head)

    def abort(self) -> None:
        """Drop the connection mid-exchange (the client went away): no more callbacks."""
        self.sink = None
        self.transport.close()

    # -- asyncio ---------------------------------------------------------------------
    def connection_made(self, transport) -> None:
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family != socket.AF_UNIX:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        sink = self.sink
        if sink is None:  # bytes nobody asked for: this connection is not reusable
            self.transport.close()
            return
        self._got = True
        if self._raw is not None:
            self._raw = self._raw + data if self._raw else data
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
    def on_headers_complete(self) -> None:
        raw, self._raw = self._raw, None
        sink = self.sink
        if sink is None or raw is None:
            return
        code = self.parser.get_status_code()
        end = raw.find(b"\r\n\r\n")  # the parser took the head: CRLF lines, no folding
        hop = _HOP_IN_HEAD.findall(raw, 0, end)
        bodyless = self._head_only or code in (204, 304) or code < 200
        if (sink.plain and not bodyless and len(hop) == 1 and hop[0][0].lower() == b"content-length"
                and raw.startswith(b"HTTP/1.1 ")):
            if len(raw) == end + 4 + int(hop[0][1]):  # all of it came in this read
                self._whole = True
                sink.on_raw_head(code, raw)
            else:
                sink.on_raw_head(code, raw[:end + 4])
            return
        lines = raw[:end].split(b"\r\n")
        status = lines[0].split(b" ", 2)
        length, chunked, headers = None, False, []
        for line in lines[1:]:
            k, _, v = line.partition(b":")
            v = v.strip(b" \t")
            lk = k.lower()
            if lk == b"content-length":
                length = v
            elif lk == b"transfer-encoding":
                chunked = b"chunked" in v.lower()
            elif lk not in HOP_BY_HOP:
                headers.append((k, v))
        if not bodyless and length is None and not chunked:
            self._until_close = True
        sink.on_head(code, status[2] if len(status) > 2 else b"", headers, length, bodyless)
        if self._head_only:  # the parser cannot know there is no body: finish here, don't reuse
            self.sink = None
            self.transport.close()
            sink.on_done()

    def on_body(self, data: bytes) -> None:
        if self.sink is not None and not self._whole:
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
    """Idle keep-alive connections to one replica: at ``host:port``, or at the unix socket
    ``socket`` when given."""

    def __init__(self, host: str, port: int, size: int = 256, socket: str = ""):
        self.host, self.port, self.size, self.socket = host, port, size, socket
        self.idle: list[Upstream] = []
        self.hostport = b"localhost" if socket else f"{host}:{port}".encode()

    def take(self) -> Upstream | None:
        while self.idle:
            u = self.idle.pop()
            if not u.closed and not u.transport.is_closing():
                return u
        return None

    async def connect(self) -> Upstream:
        loop = asyncio.get_running_loop()
        try:
            if self.socket:
                _, u = await loop.create_unix_connection(lambda: Upstream(self), self.socket)
            else:
                _, u = await loop.create_connection(lambda: Upstream(self), self.host, self.port)
        except OSError as e:
            where = self.socket or f"{self.host}:{self.port}"
            raise NotSent(f"cannot connect to {where}: {e}", refused=True) from None
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


__all__ = ["HOP_BY_HOP", "NotSent", "Pool", "Sink", "Upstream", "UpstreamError"]
