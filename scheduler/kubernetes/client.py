"""A small asyncio client for the Kubernetes API that speaks plain JSON dicts.

``kubernetes_asyncio`` loads the configuration (kubeconfig or in-cluster service account);
requests go straight through one shared ``aiohttp`` session. The scheduler's hot paths
(watch events, Bindings) would spend most of their time building and walking generated
model objects, so this client hands out the decoded JSON as it came.

Errors: every non-2xx answer raises ``ApiError`` with the HTTP status and the server's
``Status`` message; ``ApiError.status`` 404/409/422 are the ones callers usually handle.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast
from urllib.parse import urlencode

import aiohttp
import yaml

from gpupool.errors import GpupoolError

__all__ = ["ApiError", "KubeClient"]

JSON = dict[str, Any]


class ApiError(GpupoolError):
    """The API server answered with an error status."""

    def __init__(self, status: int, message: str, body: JSON | None = None):
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.message = message
        self.body = body or {}


class KubeClient:
    """``async with KubeClient.from_kubeconfig(path) as kc: await kc.get("/api/v1/nodes")``."""

    def __init__(self, host: str, token: str | None, ca_file: str | None, verify: bool = True,
                 max_connections: int = 64, client_cert: tuple[str, str] | None = None,
                 ca_data: str | None = None):
        self.host = host.rstrip("/")
        self._headers = {"Accept": "application/json"}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        if ca_file or ca_data:
            ctx = ssl.create_default_context(cafile=ca_file, cadata=ca_data)
        else:
            ctx = ssl.create_default_context()
        if not verify:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        if client_cert:
            ctx.load_cert_chain(*client_cert)
        self._ssl = ctx
        self._max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None

    # ------------------------------------------------------------------ configuration
    @classmethod
    async def from_kubeconfig(cls, path: str | None = None, **kw: Any) -> KubeClient:
        """From a kubeconfig file, or in-cluster configuration when ``path`` is None and
        the process runs in a pod."""
        simple = _simple_kubeconfig(path) if path else None
        if simple is not None:
            return cls(**simple, **kw)
        # kubernetes_asyncio for everything else (in-cluster, exec plugins, auth providers);
        # importing it costs ~0.7 s of CPU, which a simple kubeconfig does not need to pay
        from kubernetes_asyncio import client, config

        conf = client.Configuration()
        if path is None and config.incluster_config.SERVICE_HOST_ENV_NAME in __import__("os").environ:
            config.load_incluster_config(client_configuration=conf)
        else:
            await config.load_kube_config(config_file=path, client_configuration=conf,
                                          persist_config=False)
        token = None
        auth = conf.api_key.get("BearerToken") or conf.api_key.get("authorization")
        if auth:
            token = auth.removeprefix("Bearer ").strip()
        cert = (conf.cert_file, conf.key_file) if conf.cert_file and conf.key_file else None
        return cls(cast(str, conf.host), token, conf.ssl_ca_cert, verify=conf.verify_ssl,
                   client_cert=cert, **kw)

    @classmethod
    def from_file_or_pod(cls, path: str = "", **kw: Any) -> KubeClient:
        """Without I/O on the network: from a simple kubeconfig file (``path``), else from
        the pod's service account (in-cluster). ValueError when neither is there."""
        if path:
            simple = _simple_kubeconfig(path)
            if simple is None:
                raise ValueError(f"{path}: only a server, a CA and a token or client certificate "
                                 "are understood in a kubeconfig")
            return cls(**simple, **kw)
        sa = Path("/var/run/secrets/kubernetes.io/serviceaccount")
        host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT")
        if not host or not (sa / "token").exists():
            raise ValueError("no kubeconfig given and not running in a pod (no service account)")
        if ":" in host:
            host = f"[{host}]"
        return cls(f"https://{host}:{port or 443}", (sa / "token").read_text().strip(),
                   str(sa / "ca.crt"), **kw)

    async def __aenter__(self) -> KubeClient:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def open(self) -> None:
        if self._session is None:
            conn = aiohttp.TCPConnector(ssl=self._ssl, limit=self._max_connections)
            self._session = aiohttp.ClientSession(
                connector=conn, headers=self._headers, json_serialize=json.dumps,
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
            )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    # ------------------------------------------------------------------------ requests
    def _url(self, path: str, params: dict[str, Any] | None) -> str:
        q = {k: v for k, v in (params or {}).items() if v is not None}
        return f"{self.host}{path}" + (f"?{urlencode(q)}" if q else "")

    async def request(self, method: str, path: str, body: Any = None,
                      params: dict[str, Any] | None = None,
                      content_type: str = "application/json", timeout: float = 60.0,
                      decode: bool = True, as_bytes: bool = False) -> Any:
        """``body``: a JSON value, or bytes already serialised. ``decode=False``: a
        successful answer's body is not parsed: ``{}`` is returned, or with ``as_bytes`` the
        bytes (text endpoints such as /metrics)."""
        if self._session is None:
            await self.open()
        assert self._session is not None
        data = body if body is None or isinstance(body, bytes) else json.dumps(body)
        async with self._session.request(
            method, self._url(path, params), data=data,
            headers={"Content-Type": content_type},
            timeout=aiohttp.ClientTimeout(total=timeout),
        ) as r:
            raw = await r.read()
            if r.status < 300 and not decode:
                return raw if as_bytes else {}
            doc = json.loads(raw) if raw else {}
            if r.status >= 300:
                raise ApiError(r.status, doc.get("message", raw[:300].decode(errors="replace")), doc)
            return doc

    async def get(self, path: str, **params: Any) -> JSON:
        return await self.request("GET", path, params=params)

    async def post(self, path: str, body: JSON, **params: Any) -> JSON:
        return await self.request("POST", path, body, params=params)

    async def put(self, path: str, body: JSON) -> JSON:
        return await self.request("PUT", path, body)

    async def patch(self, path: str, body: Any, kind: str = "merge") -> JSON:
        ctype = {"merge": "application/merge-patch+json",
                 "strategic": "application/strategic-merge-patch+json",
                 "json": "application/json-patch+json"}[kind]
        return await self.request("PATCH", path, body, content_type=ctype)

    async def apply(self, path: str, obj: JSON, versioned: bool = False) -> JSON:
        """Create ``obj`` in the collection ``path``, or replace the object of its name there
        (POST, then PUT on 409). ``versioned``: the kind's updates must name the version they
        replace (CustomResourceDefinitions, custom resources), read from the object there."""
        try:
            return await self.post(path, obj)
        except ApiError as e:
            if e.status != 409:
                raise
        at = f"{path}/{obj['metadata']['name']}"
        if versioned:
            old = await self.get(at)
            obj = {**obj, "metadata": {**obj["metadata"],
                                       "resourceVersion": old["metadata"]["resourceVersion"]}}
        return await self.put(at, obj)

    async def ensure(self, path: str, obj: JSON) -> JSON | None:
        """Create ``obj`` in the collection ``path`` unless an object of its name is there
        (left as it is: None)."""
        try:
            return await self.post(path, obj)
        except ApiError as e:
            if e.status != 409:
                raise
            return None

    async def delete(self, path: str, body: JSON | None = None, **params: Any) -> JSON:
        return await self.request("DELETE", path, body, params=params)

    async def list_all(self, path: str, limit: int = 500, **params: Any) -> tuple[list[JSON], str]:
        """Every item of a collection, paged; returns (items, resourceVersion)."""
        items: list[JSON] = []
        cont = None
        while True:
            doc = await self.get(path, limit=limit, **{"continue": cont}, **params)
            items.extend(doc.get("items") or [])
            cont = (doc.get("metadata") or {}).get("continue")
            if not cont:
                return items, doc["metadata"]["resourceVersion"]

    async def watch(self, path: str, resource_version: str, **params: Any
                    ) -> AsyncIterator[JSON]:
        """Watch events from ``resource_version`` on; ends when the server closes the
        stream. Raises ApiError(410) when the version is too old (relist then)."""
        if self._session is None:
            await self.open()
        assert self._session is not None
        q = {"watch": "true", "resourceVersion": resource_version,
             "allowWatchBookmarks": "true", "timeoutSeconds": 300, **params}
        async with self._session.get(
            self._url(path, q), timeout=aiohttp.ClientTimeout(total=None, sock_read=400)
        ) as r:
            if r.status >= 300:
                doc = json.loads(await r.read() or b"{}")
                raise ApiError(r.status, doc.get("message", ""), doc)
            buf = b""
            async for chunk in r.content.iter_any():
                buf += chunk
                if b"\n" not in chunk:
                    continue
                # one split per chunk: a chunk holds many events in a burst, and cutting
                # them off one at a time copies the rest of the buffer each time
                *lines, buf = buf.split(b"\n")
                for line in lines:
                    if not line.strip():
                        continue
                    ev = json.loads(line)
                    if ev.get("type") == "ERROR":
                        obj = ev.get("object") or {}
                        raise ApiError(obj.get("code", 500), obj.get("message", ""), obj)
                    yield ev

    async def wait_for(self, predicate, timeout: float, interval: float = 0.2):  # pragma: no cover
        """Poll ``await predicate()`` until it returns something truthy."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            v = await predicate()
            if v:
                return v
            if loop.time() > deadline:
                raise TimeoutError("condition not met")
            await asyncio.sleep(interval)


def _simple_kubeconfig(path: str) -> dict[str, Any] | None:
    """``KubeClient`` arguments from one kubeconfig file whose current context needs only
    a server, a CA (file or data) and a bearer token (inline or file) or client
    certificate files; None for anything else."""
    try:
        doc = yaml.safe_load(Path(path).read_text())
        ctx_name = doc["current-context"]
        ctx = next(c["context"] for c in doc["contexts"] if c["name"] == ctx_name)
        cluster = next(c["cluster"] for c in doc["clusters"] if c["name"] == ctx["cluster"])
        user: dict = next((u["user"] for u in doc.get("users") or () if u["name"] == ctx.get("user")), {})
    except (OSError, yaml.YAMLError, KeyError, TypeError, StopIteration):
        return None
    user = user or {}
    if set(user) - {"token", "tokenFile", "client-certificate", "client-key"} \
            or set(cluster) - {"server", "certificate-authority", "certificate-authority-data",
                               "insecure-skip-tls-verify"}:
        return None
    here = Path(path).parent

    def rel(p: str) -> str:
        return str(here / p)

    token = user.get("token")
    if token is None and user.get("tokenFile"):
        token = Path(rel(user["tokenFile"])).read_text().strip()
    cert = None
    if user.get("client-certificate") or user.get("client-key"):
        if not (user.get("client-certificate") and user.get("client-key")):
            return None
        cert = (rel(user["client-certificate"]), rel(user["client-key"]))
    ca_data = cluster.get("certificate-authority-data")
    return {
        "host": cluster["server"], "token": token,
        "ca_file": rel(cluster["certificate-authority"]) if cluster.get("certificate-authority") else None,
        "ca_data": base64.b64decode(ca_data).decode() if ca_data else None,
        "verify": not cluster.get("insecure-skip-tls-verify", False), "client_cert": cert,
    }  # fmt: skip
