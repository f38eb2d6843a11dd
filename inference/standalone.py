"""gpupool inference without the hub: an embedded scheduler on a declared inventory, the
controller and the activator in one process (benchmarks, local use).

    python -m inference --port 9000 --services services.json [--gpus 4] [--quota 4]

``services.json``: a list of service descriptions (``inference.spec``), all in project
``default`` unless they say otherwise. ``GET /_status`` lists the services' state.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging

from tornado import web
from tornado.httpserver import HTTPServer

from scheduler.embedded import EmbeddedScheduler
from scheduler.model import DEFAULT_POOL, GPU, Department, Node, Project, Quota

from . import activator
from .backends.embedded import EmbeddedBackend
from .controller import Controller
from .spec import parse_spec


class OrgStore:
    """scheduler.embedded.Store for one department and the projects the services name."""

    def __init__(self, projects: set[str], quota: float):
        self.projects, self.quota = projects, quota

    def version(self):
        return 1

    def load_org(self):
        q = Quota(self.quota)
        return ([Department("default", {DEFAULT_POOL: Quota(self.quota * len(self.projects))})],
                [Project(p, "default", {DEFAULT_POOL: q}) for p in sorted(self.projects)])

    def load_workloads(self):
        return []

    def record(self, decisions, snapshot):
        pass

    def set_state(self, name, state, **fields):
        pass

    def event(self, kind, message, workload="", project=""):
        logging.getLogger("gpupool.inference").info("%s: %s", kind, message)


class StatusHandler(web.RequestHandler):
    def initialize(self, controller: Controller):
        self.controller = controller

    def get(self):
        self.write({n: s.status() for n, s in self.controller.services.items()})


async def serve(args) -> None:
    with open(args.services) as f:
        specs = [parse_spec({"project": "default", **d}) for d in json.load(f)]
    node = Node("local", [GPU(i, "declared", 81920) for i in range(args.gpus)])
    sched = EmbeddedScheduler(OrgStore({s.project for s in specs}, args.quota), [node], 0.5)
    sched.start()
    await sched.cycle()
    controller = Controller(EmbeddedBackend(sched), tick_s=args.tick)
    controller.start()
    for s in specs:
        controller.put(s)
    app = web.Application([("/_status", StatusHandler, {"controller": controller}),
                           *activator.routes(controller, "/")])
    HTTPServer(app).listen(args.port, "127.0.0.1")
    print(f"activator listening on 127.0.0.1:{args.port}", flush=True)
    await asyncio.Event().wait()


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m inference", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--port", type=int, default=9000)
    p.add_argument("--services", required=True)
    p.add_argument("--gpus", type=int, default=4)
    p.add_argument("--quota", type=float, default=4.0)
    p.add_argument("--tick", type=float, default=1.0)
    logging.basicConfig(level=logging.WARNING)
    asyncio.run(serve(p.parse_args(argv)))
