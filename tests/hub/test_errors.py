"""An unexpected error in a handler is a JSON 500 body, never an empty page or a traceback."""

from __future__ import annotations

import asyncio
import json

from tornado.httpclient import AsyncHTTPClient
from tornado.web import Application

from hub_ext.api.base import ApiHandler
from tests.served import served


class Broken(ApiHandler):
    def get(self):
        raise RuntimeError("secret detail that must not reach the client")


def test_unexpected_error_is_a_json_500():
    async def run():
        app = Application([("/broken", Broken)], user_for_tests={"name": "alice", "scopes": [
            "custom:gpupool:use"]})
        async with served(app) as root:
            return await AsyncHTTPClient().fetch(f"{root}/broken", raise_error=False)

    r = asyncio.run(run())
    assert r.code == 500
    body = json.loads(r.body)
    assert body["error"]["status"] == 500
    assert body["error"]["message"] == "internal error; see the service log"
    assert b"secret detail" not in r.body
