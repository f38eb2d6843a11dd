"""Build and run the service's tornado application."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from dataclasses import dataclass
from urllib.parse import urlparse

from jupyterhub.services.auth import HubOAuthCallbackHandler
from jupyterhub.utils import url_path_join
from tornado import web
from tornado.httpserver import HTTPServer

from ..api import routes as api
from ..backends import mode
from ..config import Gpupool, load_config
from ..schema import make_sessionmaker
from ..ssh import gateway as ssh_gateway
from ..validation import BODY_DRAIN_FACTOR
from . import culler, pages
from .hubapi import HubAPI
from .metrics import DATABASE, MetricsHandler

log = logging.getLogger("gpupool.service")


@dataclass
class Context:
    cfg: Gpupool
    Session: object
    hub: HubAPI


def make_app(cfg: Gpupool, prefix: str, session_factory=None, hub: HubAPI | None = None,
             user_for_tests: dict | None = None) -> web.Application:
    ctx = Context(cfg, session_factory or make_sessionmaker(cfg.db_url), hub or HubAPI())
    DATABASE.watch(ctx.Session)
    prefix = prefix if prefix.endswith("/") else prefix + "/"
    handlers = [
        (url_path_join(prefix, "oauth_callback"), HubOAuthCallbackHandler),
        (prefix + "metrics", MetricsHandler),
        *api.routes(prefix),
        *pages.routes(prefix.rstrip("/")),
    ]
    return web.Application(
        handlers, gpupool=ctx, prefix=prefix, cookie_secret=os.urandom(32),
        hub_prefix=os.environ.get("JUPYTERHUB_BASE_URL", "/") + "hub/",
        user_for_tests=user_for_tests, max_body_size=cfg.max_body_size,
    )


async def _end_with_hub(stop: asyncio.Event, every_s: float = 1.0) -> None:
    """A hub that dies without stopping its services (SIGKILL) starts them again when it
    comes back: the old copy must have let go of its port by then."""
    hub = os.getppid()
    while os.getppid() == hub:
        await asyncio.sleep(every_s)
    log.info("the hub (pid %d) is gone", hub)
    stop.set()


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="[gpupool-service %(asctime)s] %(message)s")
    cfg = load_config()
    cfg.ssh_port = cfg.ssh_gateway_port()  # the port the hub chose when ssh_port is None
    prefix = os.environ.get("JUPYTERHUB_SERVICE_PREFIX", "/services/gpupool/")
    app = make_app(cfg, prefix)
    url = urlparse(os.environ.get("JUPYTERHUB_SERVICE_URL", f"http://127.0.0.1:{cfg.service_port}"))

    async def run():
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            asyncio.get_running_loop().add_signal_handler(sig, stop.set)
        # The API holds at most max_body_size of a body and answers 413 past it (base.py);
        # past BODY_DRAIN_FACTOR times that, tornado closes the connection unread.
        hard = cfg.max_body_size * BODY_DRAIN_FACTOR
        HTTPServer(app, xheaders=True, max_body_size=hard,
                   max_buffer_size=hard).listen(url.port, url.hostname)
        log.info("listening on %s%s", url.geturl(), prefix)
        # The SSH gateway runs here: this process is the hub's user (root in embedded mode),
        # holds the database and reaches the hub's API (hub_ext/ssh/gateway.py).
        gateway = await ssh_gateway.run(cfg, app.settings["gpupool"].Session, app.settings["gpupool"].hub.url,
                                        os.environ.get("JUPYTERHUB_PUBLIC_URL", ""), backend_for=mode(cfg).ssh)
        # idle culling (cull_idle_s, policies' idle timeouts) and policies' maximum runtimes
        asyncio.ensure_future(culler.run(app.settings["gpupool"]))
        asyncio.ensure_future(_end_with_hub(stop))
        await stop.wait()
        log.info("stopping")
        if gateway is not None:
            gateway.close()

    asyncio.run(run())
