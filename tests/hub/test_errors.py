"""An unexpected error in a handler is a JSON 500 body, never an empty page or a traceback."""

from __future__ import annotations

import asyncio
import json

from tornado.httpclient import AsyncHTTPClient
from tornado.httpserver import HTTPServer
from tornado.netutil import bind_sockets
from tornado.web import Application

from hub_ext.service.base import ApiHandler


class Broken(ApiHandler):
    def get(self):
        raise RuntimeError("secret detail that must not reach the client")


def test_unexpected_error_is_a_json_500():
    async def run():
        app = Application([("/broken", Broken)], user_for_tests={"name": "alice", "scopes": [
            "custom:gpupool:use"]})
        socks = bind_sockets(0, "127.0.0.1")
        server = HTTPServer(app)
        server.add_sockets(socks)
        try:
            url = f"http://127.0.0.1:{socks[0].getsockname()[1]}/broken"
            r = await AsyncHTTPClient().fetch(url, raise_error=False)
        finally:
            server.stop()
        return r

    r = asyncio.run(run())
    assert r.code == 500
    body = json.loads(r.body)
    assert body["error"]["status"] == 500
    assert body["error"]["message"] == "internal error; see the service log"
    assert b"secret detail" not in r.body
