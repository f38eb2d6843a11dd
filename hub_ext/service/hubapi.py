"""Calls to the hub's REST API with the service's token (start/stop users' servers)."""

from __future__ import annotations

import json
import os
from urllib.parse import quote

from tornado.httpclient import AsyncHTTPClient, HTTPClientError


class HubAPI:
    def __init__(self, url: str | None = None, token: str | None = None):
        self.url = (url or os.environ.get("JUPYTERHUB_API_URL", "http://127.0.0.1:8081/hub/api")).rstrip("/")
        self.token = token or os.environ.get("JUPYTERHUB_API_TOKEN", "")

    async def call(self, method: str, path: str, body=None) -> tuple[int, dict | None]:
        req = dict(method=method, headers={"Authorization": f"token {self.token}"},
                   request_timeout=120)
        if body is not None:
            req["body"] = json.dumps(body)
            req["headers"]["Content-Type"] = "application/json"
        elif method in ("POST", "PUT", "PATCH"):
            req["body"] = ""
        try:
            r = await AsyncHTTPClient().fetch(self.url + path, **req)
        except HTTPClientError as e:
            text = e.response.body.decode() if e.response is not None and e.response.body else ""
            try:
                return e.code, json.loads(text)
            except ValueError:
                return e.code, {"message": text or str(e)}
        return r.code, (json.loads(r.body) if r.body else None)

    @staticmethod
    def _server_path(user: str, server: str) -> str:
        return f"/users/{quote(user)}/servers/{quote(server)}" if server else f"/users/{quote(user)}/server"

    async def start_server(self, user: str, server: str, options: dict):
        return await self.call("POST", self._server_path(user, server), options)

    async def stop_server(self, user: str, server: str):
        return await self.call("DELETE", self._server_path(user, server))

    async def users(self):
        return await self.call("GET", "/users?state=active")
