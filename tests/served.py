"""A tornado application served on a free loopback port for the length of a test: the
service's real application (``make_app``) or any other, without a hub in front."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from tornado.httpserver import HTTPServer
from tornado.netutil import bind_sockets
from tornado.web import Application


@contextlib.asynccontextmanager
async def served(app: Application) -> AsyncIterator[str]:
    """Serve ``app`` on 127.0.0.1 and a port the kernel picks; yields ``http://127.0.0.1:PORT``
    (no trailing slash). The server stops on the way out. Call inside a running event loop."""
    socks = bind_sockets(0, "127.0.0.1")
    server = HTTPServer(app)
    server.add_sockets(socks)
    try:
        yield f"http://127.0.0.1:{socks[0].getsockname()[1]}"
    finally:
        server.stop()
