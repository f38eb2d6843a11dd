"""Inference services of the hub process.

``configure(c, cfg, rt)`` (called from ``hub_ext.hubconfig.configure``), on Kubernetes,
publishes the services for the chart's activator (``published``); otherwise it registers the
activator as the JupyterHub service ``gpupool-serve`` -- the proxy routes
``/services/gpupool-serve/NAME/...`` to it -- and starts, on the hub's event loop, the
controller with processes placed by the hub's scheduler, the activator's HTTP server,
and a loop that follows the ``inference_services`` table the REST API writes.

Authentication (``auth``): a JupyterHub token (``Authorization: token ...``, ``Bearer``, or
``?token=``) of a member of the service's project, or of a gpupool admin; a service with
``public: true`` takes anyone. On Kubernetes the chart's activator asks the hub's REST API
with its own service token (``$GPUPOOL_ACTIVATOR_TOKEN``, registered here as the JupyterHub
service ``gpupool-activator``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
from pathlib import Path

from sqlalchemy import select

from hub_ext.org import projects as org
from hub_ext.org import roles
from inference import activator
from inference.controller import Controller
from inference.service import Service

from .auth import TokenAuth
from .db import REPLICA, InferenceRow, replica_rows
from .embedded import free_port
from .idle import idle_limits, store_status
from .spec import parse_spec

log = logging.getLogger("gpupool.inference")
NAME = "gpupool-serve"
ACTIVATOR = roles.ACTIVATOR_ROLE["services"][0]  # the chart's activator, on Kubernetes
ADMIN = roles.ADMIN_SCOPE


class HubTokenAuth(TokenAuth):
    """``auth.TokenAuth`` in the hub: the token's user from JupyterHub (through
    jupyterhub.services.auth.HubAuth), their projects from the hub's database."""

    def __init__(self, hub_auth, Session, cache_s: float = 30.0):
        super().__init__(self._caller, cache_s)
        self.hub_auth = hub_auth
        self.Session = Session

    async def _caller(self, token: str) -> roles.Who | None:
        model = await self.hub_auth.user_for_token(token, sync=False)
        if not model:
            return None
        with self.Session() as s:
            mine = frozenset(org.projects_of(s, model["name"]))
        return roles.Who(model["name"], platform_admin=ADMIN in model.get("scopes", []),
                         projects=mine)


class HubInference:
    """Where the hub serves (``Backend.serves_inference``): its activator and controller, with
    the backend's replicas; those that outlived the hub are adopted at the start."""

    def __init__(self, rt, port: int, token: str, poll_s: float = 1.0):
        self.rt, self.port, self.token, self.poll_s = rt, port, token, poll_s
        self.controller = Controller(rt.backend.replicas())
        self._status: dict[str, dict] = {}

    def start(self) -> None:
        from jupyterhub.services.auth import HubAuth

        hub_auth = HubAuth(api_token=self.token, cache_max_age=60,
                           api_url=f"http://127.0.0.1:{self.rt.cfg.hub_port}/hub/api")
        self.server = activator.Server(self.controller, f"/services/{NAME}/",
                                       HubTokenAuth(hub_auth, self.rt.Session), lookup=self.lookup)
        asyncio.ensure_future(self.server.listen(self.port)).add_done_callback(self._listening)
        self.recover()
        self.controller.start()
        asyncio.ensure_future(self._follow())

    def recover(self) -> None:
        """After a hub restart, before the scheduler's first cycle: replicas that outlived
        the hub serve again (once they answer their probe) instead of new ones; the rows
        of the others go, so nothing else starts them."""
        with self.rt.Session() as s:
            services = s.scalars(select(InferenceRow)).all()
            specs = {r.name: r.spec for r in services}
            limits = idle_limits(s, services)
            rows = replica_rows(s)
        kept = 0
        for name, row in rows.items():
            service = REPLICA.match(name).group(1)
            try:
                spec = parse_spec(specs[service])
            except Exception as e:  # a row written by an older version: say why, drop it
                log.warning("inference service %s: %s", service, e)
                spec = None
            if (row.state == "running" and spec is not None
                    and self.controller.adopt(spec, name, row, limits.get(service))):
                kept += 1
            else:
                self.controller.backend.discard(name)
        if rows:
            log.info("inference: %d of %d replicas adopted after the restart", kept, len(rows))

    def lookup(self, name: str) -> Service | None:
        """A service the REST API has written since the last ``sync``: the activator asks
        before it answers 404, so a submitted service is served at once."""
        with self.rt.Session() as s:
            row = s.get(InferenceRow, name)
            if row is None:
                return None
            limit = idle_limits(s, [row])[name]
            try:
                spec = parse_spec(row.spec)
            except Exception as e:  # a row written by an older version: say why, skip
                log.warning("inference service %s: %s", name, e)
                return None
            svc = self.controller.put(spec, limit)
            self._store(s, name, svc)
            s.commit()
        return svc

    def _store(self, s, name: str, svc: Service) -> None:
        """The service's state onto its row when it changed, or the row has none yet (a
        service submitted again under the name of one deleted since the last pass)."""
        st = svc.status()
        st.pop("requests_total", None)
        if (row := s.get(InferenceRow, name)) and (self._status.get(name) != st or not row.status):
            store_status(s, row, st)
            self._status[name] = st

    def _listening(self, fut: asyncio.Future) -> None:
        if fut.cancelled() or fut.exception() is None:
            return
        log.error("inference activator cannot listen on 127.0.0.1:%d (GPUPOOL_SERVE_PORT): %s",
                  self.port, fut.exception())

    async def _follow(self) -> None:
        while True:
            try:
                await self.sync()
            except Exception:
                log.exception("following inference services failed")
            await asyncio.sleep(self.poll_s)

    async def sync(self) -> None:
        with self.rt.Session() as s:
            rows = {r.name: r for r in s.scalars(select(InferenceRow)).all()}
            limits = idle_limits(s, rows.values())
        for name in set(self.controller.services) - set(rows):
            self._status.pop(name, None)
            await self.controller.remove(name)
        for name, row in rows.items():
            try:
                self.controller.put(parse_spec(row.spec), limits[name])
            except Exception as e:  # a row written by an older version: say why, skip
                log.warning("inference service %s: %s", name, e)
        with self.rt.Session() as s:
            for name, svc in list(self.controller.services.items()):
                self._store(s, name, svc)
            s.commit()


class PublishedInference:
    """On Kubernetes: the services are published for the chart's activator, which serves and
    scales them (``published``); the hub runs no activator of its own. The hub's rows are
    compared with the watched ConfigMaps at each change of one and every ``poll_s``."""

    def __init__(self, rt, poll_s: float = 1.0):
        from .published import Publisher

        self.publisher = Publisher(rt.backend.kube, rt.cfg.namespace, rt.Session, rt.delivery.vault)
        self.poll_s = poll_s

    def start(self) -> None:
        asyncio.ensure_future(self.publisher.follow(self.poll_s))


def configure(c, cfg, rt) -> HubInference | PublishedInference:
    """Runs the activator in the hub, with the replicas of ``rt.backend`` (embedded), or
    follows the chart's (Kubernetes)."""
    activator_token = os.environ.get("GPUPOOL_ACTIVATOR_TOKEN", "")
    if activator_token:  # an activator outside the hub (the chart's) asks who may call
        c.JupyterHub.services.append({"name": ACTIVATOR, "api_token": activator_token,
                                      "display": False})
        c.JupyterHub.load_roles.append(roles.ACTIVATOR_ROLE)
    if not rt.backend.serves_inference:
        published = PublishedInference(rt)
        try:
            asyncio.get_running_loop().call_soon(published.start)
        except RuntimeError:  # config loaded outside the hub: nothing to start
            pass
        return published
    # a free port unless set: nothing but the hub's proxy (and a metrics scraper told the
    # port) talks to the activator, and two hubs on one machine must not collide
    port = int(os.environ.get("GPUPOOL_SERVE_PORT") or free_port())
    token_file = Path(cfg.state_dir) / "gpupool-serve-token"
    if not token_file.exists():
        token_file.write_text(secrets.token_hex(32))
        token_file.chmod(0o600)
    token = token_file.read_text().strip()
    c.JupyterHub.services.append({"name": NAME, "url": f"http://127.0.0.1:{port}",
                                  "api_token": token, "display": False})
    hub = HubInference(rt, port, token)
    try:
        asyncio.get_running_loop().call_soon(hub.start)
    except RuntimeError:  # config loaded outside the hub: nothing to start
        pass
    return hub


__all__ = ["HubInference", "HubTokenAuth", "PublishedInference", "configure"]
