"""gpupool inference without a running hub: an embedded scheduler on a declared inventory, the
controller and the activator in one process (benchmarks, local use).

    python -m hub_ext.serving --port 9000 --services services.json [--gpus 4] [--quota 4]
                        [--loop uvloop|asyncio]

``services.json``: a list of service descriptions (``hub_ext.serving.spec``), all in project
``default`` unless they say otherwise. ``GET /_status`` lists the services' state,
``GET /metrics`` the activator's Prometheus metrics. The event loop is uvloop by default
(it roughly halves the activator's CPU per request); ``--loop asyncio`` is the stock one.
``GPUPOOL_PROFILE=FILE`` profiles the process with cProfile and writes the stats to FILE
on SIGTERM (how bench/activator.py's load was profiled).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import shutil
import signal
import tempfile
from pathlib import Path

from hub_ext.host.accounts import Accounts, default_mode, default_prefix
from hub_ext.host.cgroups import detect
from hub_ext.host.process import Launcher
from hub_ext.host.state import RUN_DIR
from inference import activator
from inference.controller import Controller
from scheduler.embedded.adapter import EmbeddedScheduler
from scheduler.model import DEFAULT_POOL, GPU, Department, Node, Project, Quota

from .embedded import EmbeddedBackend
from .spec import parse_spec


class OrgStore:
    """scheduler.embedded.adapter.Store for one department and the projects the services name."""

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

    def finish_stop(self, name):
        pass  # no rows: nothing to mark

    def event(self, kind, message, workload="", project=""):
        logging.getLogger("gpupool.inference").info("%s: %s", kind, message)


async def serve(args) -> None:
    with open(args.services) as f:
        specs = [parse_spec({"project": "default", **d}) for d in json.load(f)]
    node = Node("local", [GPU(i, "declared", 81920) for i in range(args.gpus)])
    sched = EmbeddedScheduler(OrgStore({s.project for s in specs}, args.quota), [node], 0.5)
    sched.start()
    await sched.cycle()
    state = Path(tempfile.mkdtemp(prefix="gpupool-inference-"))  # the hub's state dir's part
    backend = EmbeddedBackend(sched, launcher=Launcher(state / RUN_DIR, detect()),
                              accounts=Accounts(mode=default_mode(), prefix=default_prefix()),
                              state_dir=state)
    controller = Controller(backend, tick_s=args.tick)
    controller.start()
    for s in specs:
        controller.put(s)

    def status(req):
        return 200, "application/json", json.dumps(
            {n: s.status() for n, s in controller.services.items()}).encode()

    await activator.Server(controller, "/", local={"/_status": status}).listen(args.port)
    print(f"activator listening on 127.0.0.1:{args.port}", flush=True)
    # End normally on SIGTERM/SIGINT: the replicas run in sessions of their own and would
    # outlive us, and main() writes the profile stats after serve() returns.
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    await stop.wait()
    await controller.stop()
    # its state is a temporary folder of this run's: nothing in it outlives the run
    shutil.rmtree(backend.launcher.regions, ignore_errors=True)
    shutil.rmtree(state, ignore_errors=True)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m hub_ext.serving", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--port", type=int, default=9000, help="the activator's port")
    p.add_argument("--services", required=True, help="JSON file: a list of service descriptions")
    p.add_argument("--gpus", type=int, default=4, help="declared GPUs of the one local node")
    p.add_argument("--quota", type=float, default=4.0, help="GPU quota of every project")
    p.add_argument("--tick", type=float, default=1.0, help="seconds between the controller's passes")
    p.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop", help="event loop")
    return p


def main(argv=None) -> None:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    profile_to = os.environ.get("GPUPOOL_PROFILE")
    if profile_to:
        import cProfile

        prof = cProfile.Profile()
        prof.enable()
    if args.loop == "uvloop":
        import uvloop

        uvloop.run(serve(args))
    else:
        asyncio.run(serve(args))
    if profile_to:
        prof.disable()
        prof.dump_stats(profile_to)
