"""A small HTTP client for tests and benches: log in with the shared password, make
JupyterHub API tokens, call the gpupool API (standard library only)."""

from __future__ import annotations

import http.cookiejar
import json
import re
import urllib.error
import urllib.parse
import urllib.request


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *a, **k):
        return None


class HubClient:
    def __init__(self, base: str):
        self.base = base.rstrip("/")
        self.jar = http.cookiejar.CookieJar()
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self.jar))

    def _xsrf(self) -> str:
        for c in self.jar:
            if c.name == "_xsrf":
                return c.value
        return ""

    def login(self, user: str, password: str) -> HubClient:
        page = self.opener.open(self.base + "/hub/login").read().decode()
        m = re.search(r'name="_xsrf" value="([^"]+)"', page)
        data = urllib.parse.urlencode({"username": user, "password": password,
                                       "_xsrf": m.group(1) if m else self._xsrf()}).encode()
        r = self.opener.open(self.base + "/hub/login", data)
        if "/hub/login" in r.geturl():
            raise RuntimeError(f"login failed for {user}")
        return self

    def token(self, user: str) -> str:
        body = json.dumps({"note": "test", "expires_in": 3600}).encode()
        req = urllib.request.Request(self.base + f"/hub/api/users/{user}/tokens", data=body, method="POST",
                                     headers={"X-XSRFToken": self._xsrf(), "Content-Type": "application/json",
                                              "Referer": self.base + "/hub/token"})
        return json.loads(self.opener.open(req).read())["token"]


def call(base: str, token: str, method: str, path: str, body=None, api=True):
    """(status, json or None) for the gpupool API (api=True) or a hub path."""
    url = base.rstrip("/") + ("/services/gpupool/api/v1" if api else "") + path
    data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"token {token}"
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    opener = urllib.request.build_opener(_NoRedirect)
    try:
        with opener.open(req, timeout=60) as r:
            text = r.read()
            try:
                return r.status, (json.loads(text) if text else None)
            except ValueError:  # a page, not JSON
                return r.status, {"raw": text.decode(errors="replace")}
    except urllib.error.HTTPError as e:
        text = e.read()
        try:
            return e.code, json.loads(text)
        except ValueError:
            return e.code, {"raw": text.decode(errors="replace")}
