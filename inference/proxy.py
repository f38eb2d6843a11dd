"""A small HTTP/1.1 client for the activator's hop to a replica: keep-alive connections
pooled per replica, the response streamed to a sink chunk by chunk (never buffered whole).

Tornado's own ``simple_httpclient`` opens a connection per request; measured here on the
shared 2-core machine that costs more than everything else the activator does, hence this
module (asyncio streams, one parser for Content-Length, chunked and read-to-close bodies).

Errors: ``NotSent`` means the replica cannot have seen the request (connect refused, or a
pooled connection found dead before any byte of a response): the caller may retry it on
another replica. ``UpstreamError`` means it may have been seen: the caller answers 502.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
    "transfer-encoding", "upgrade", "host", "content-length",
})
READ = 64 * 1024


class NotSent(ConnectionError):
    """The replica did not get the request; safe to retry elsewhere. ``refused``: the
    replica is not listening (down or not yet up), not just a stale connection."""

    def __init__(self, message: str, refused: bool = False):
        super().__init__(message)
        self.refused = refused


class UpstreamError(ConnectionError):
    """The replica failed after it may have got the request."""


class Conn:
    __slots__ = ("reader", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader, self.writer = reader, writer

    def close(self) -> None:
        self.writer.close()


class Pool:
    """Idle keep-alive connections to one replica."""

    def __init__(self, host: str, port: int, size: int = 256):
        self.host, self.port, self.size = host, port, size
        self.idle: list[Conn] = []

    async def get(self) -> tuple[Conn, bool]:
        while self.idle:
            c = self.idle.pop()
            if not c.reader.at_eof() and not c.writer.is_closing():
                return c, True
            c.close()
        try:
            r, w = await asyncio.open_connection(self.host, self.port, limit=READ * 2)
        except OSError as e:
            raise NotSent(f"cannot connect to {self.host}:{self.port}: {e}", refused=True) from None
        return Conn(r, w), False

    def put(self, c: Conn) -> None:
        if len(self.idle) < self.size:
            self.idle.append(c)
        else:
            c.close()

    def close(self) -> None:
        for c in self.idle:
            c.close()
        self.idle.clear()


Head = Callable[[int, str, list[tuple[str, str]]], None]
Chunk = Callable[[bytes, bool], Awaitable[None]]  # (data, more to come)


async def forward(pool: Pool, method: str, uri: str, headers: list[tuple[str, str]], body: bytes,
                  on_head: Head, on_chunk: Chunk) -> None:
    """Send one request on a pooled connection and stream the response to the callbacks."""
    conn, reused = await pool.get()
    lines = [f"{method} {uri} HTTP/1.1\r\nHost: {pool.host}:{pool.port}\r\n"]
    for k, v in headers:
        if k.lower() not in HOP_BY_HOP:
            lines.append(f"{k}: {v}\r\n")
    if body or method in ("POST", "PUT", "PATCH"):
        lines.append(f"Content-Length: {len(body)}\r\n")
    lines.append("\r\n")
    reader = conn.reader
    try:
        conn.writer.write("".join(lines).encode("latin-1") + body)
        status_line = await reader.readline()
    except OSError as e:
        conn.close()
        if reused:
            raise NotSent(f"stale connection: {e}") from None
        raise UpstreamError(f"replica closed the connection: {e}") from None
    if not status_line:
        conn.close()
        if reused:  # the replica closed an idle connection (or died) before our write
            raise NotSent("stale connection")
        raise UpstreamError("replica closed the connection without answering")
    try:
        keep = await _read_response(status_line, reader, method, on_head, on_chunk)
    except (OSError, asyncio.IncompleteReadError, ValueError) as e:
        conn.close()
        raise UpstreamError(f"replica failed mid-response: {e}") from None
    except BaseException:
        conn.close()  # the client went away (or we were cancelled): drop the connection
        raise
    if keep:
        pool.put(conn)
    else:
        conn.close()


async def _read_response(status_line: bytes, reader: asyncio.StreamReader, method: str,
                         on_head: Head, on_chunk: Chunk) -> bool:
    parts = status_line.decode("latin-1").rstrip("\r\n").split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1."):
        raise ValueError(f"bad status line {status_line[:80]!r}")
    code = int(parts[1])
    reason = parts[2] if len(parts) > 2 else ""
    keep = parts[0] == "HTTP/1.1"
    headers: list[tuple[str, str]] = []
    length, chunked = None, False
    while True:
        line = await reader.readline()
        if line in (b"\r\n", b"\n"):
            break
        if not line:
            raise ValueError("headers cut short")
        k, _, v = line.decode("latin-1").partition(":")
        k, v = k.strip(), v.strip()
        lk = k.lower()
        if lk == "content-length":
            length = int(v)
        elif lk == "transfer-encoding":
            chunked = "chunked" in v.lower()
        elif lk == "connection":
            keep = keep and "close" not in v.lower()
        if lk not in HOP_BY_HOP or lk == "content-length":
            headers.append((k, v))
    on_head(code, reason, headers)
    if method == "HEAD" or code in (204, 304) or 100 <= code < 200:
        await on_chunk(b"", False)
        return keep
    if chunked:
        while True:
            size = int((await reader.readline()).split(b";", 1)[0].strip() or b"x", 16)
            if size == 0:
                while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                await on_chunk(b"", False)
                return keep
            data = await reader.readexactly(size)
            await reader.readexactly(2)
            await on_chunk(data, True)
    if length is not None:
        left = length
        if not left:
            await on_chunk(b"", False)
        while left > 0:
            data = await reader.read(min(left, READ))
            if not data:
                raise asyncio.IncompleteReadError(b"", left)
            left -= len(data)
            await on_chunk(data, left > 0)  # the last piece finishes the response
        return keep
    while data := await reader.read(READ):  # body until the replica closes
        await on_chunk(data, True)
    await on_chunk(b"", False)
    return False


__all__ = ["Conn", "NotSent", "Pool", "UpstreamError", "forward"]
