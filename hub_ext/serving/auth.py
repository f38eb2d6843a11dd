"""Who may call a non-public inference service: the activator's ``Authorizer``.

A caller brings a JupyterHub token (``Authorization: token ...``, ``Bearer``, or
``?token=``); ``TokenAuth`` turns it into the caller (``roles.Who``: name, platform admin,
projects) through a ``resolve`` function, keeps the answer ``cache_s`` (a known token is
checked without a round trip and without a task), and applies ``roles``' rule
``call_inference`` to the service's project. No token: 401; a token the hub does not know:
401; a caller outside the project: 403.

Where the caller comes from differs by mode, nothing else:

- in the hub (embedded, standalone): ``hub.HubTokenAuth`` asks JupyterHub for the token's
  user and reads the memberships from the hub's database;
- in the chart's activator (Kubernetes): ``HubApiAuth`` asks the hub's REST API
  (``POST /api/v1/inference-callers``, ``api.inference``), with the activator's own
  service token, which carries only ``access:services!service=gpupool`` and
  ``roles.INFERENCE_AUTH_SCOPE``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable

from inference.activator import Exchange
from inference.service import Service

from ..org import roles

NO_TOKEN = ("authenticate with a JupyterHub token (Authorization: token ...); "
            "make one at /hub/token")
BAD_TOKEN = "the JupyterHub token is not valid"
CALLERS_PATH = "api/v1/inference-callers"  # under the gpupool service's prefix

Resolve = Callable[[str], Awaitable["roles.Who | None"]]


def token_of(req: Exchange) -> str:
    scheme, _, value = req.header("Authorization").partition(" ")
    if scheme.lower() in ("token", "bearer") and value:
        return value.strip()
    return req.argument("token")


def who_from(answer: dict) -> roles.Who | None:
    """The caller from ``{"name", "admin", "projects"}`` (the REST answer); None for
    ``name`` null (a token nobody holds)."""
    if not answer.get("name"):
        return None
    return roles.Who(answer["name"], platform_admin=bool(answer.get("admin")),
                     projects=frozenset(answer.get("projects") or ()))


class TokenAuth:
    """``activator.Authorizer``: the token's caller from ``resolve`` (cached ``cache_s``,
    unknown tokens too), then the rule."""

    def __init__(self, resolve: Resolve, cache_s: float = 30.0, max_entries: int = 10_000):
        self.resolve = resolve
        self.cache_s = cache_s
        self.max_entries = max_entries
        self._callers: dict[str, tuple[float, roles.Who | None]] = {}

    def check(self, req: Exchange, svc: Service):
        token = token_of(req)
        if not token:
            return (401, NO_TOKEN, "Authorization")
        hit = self._callers.get(token)
        if hit and time.monotonic() - hit[0] < self.cache_s:
            return self.verdict(hit[1], svc)
        return self._ask(token, svc)

    async def _ask(self, token: str, svc: Service):
        who = await self.resolve(token)
        if len(self._callers) > self.max_entries:
            self._callers.clear()
        self._callers[token] = (time.monotonic(), who)
        return self.verdict(who, svc)

    @staticmethod
    def verdict(who: roles.Who | None, svc: Service):
        if who is None:
            return (401, BAD_TOKEN, "Authorization")
        decision = roles.allowed(who, "call_inference", project=svc.spec.project)
        return None if decision else (403, decision.reason, None)


class HubApiAuth(TokenAuth):
    """``TokenAuth`` that asks the hub's REST API (``base``: the gpupool service's URL, e.g.
    ``http://gpupool-hub.NS.svc/services/gpupool/``) with the activator's ``api_token``."""

    def __init__(self, base: str, api_token: str, cache_s: float = 30.0, timeout_s: float = 10.0):
        super().__init__(self._from_hub, cache_s)
        self.url = base.rstrip("/") + "/" + CALLERS_PATH
        self.api_token = api_token
        self.timeout_s = timeout_s

    async def _from_hub(self, token: str) -> roles.Who | None:
        from tornado.httpclient import AsyncHTTPClient, HTTPClientError

        try:
            r = await AsyncHTTPClient().fetch(
                self.url, method="POST", body=json.dumps({"token": token}),
                headers={"Authorization": f"token {self.api_token}",
                         "Content-Type": "application/json"},
                request_timeout=self.timeout_s)
        except HTTPClientError as e:  # the activator's own token or scopes: say which
            body = e.response.body.decode(errors="replace")[:300] if e.response else ""
            raise RuntimeError(f"{self.url} answered {e.code}: {body}") from None
        return who_from(json.loads(r.body))


__all__ = ["BAD_TOKEN", "CALLERS_PATH", "NO_TOKEN", "HubApiAuth", "TokenAuth", "token_of", "who_from"]
