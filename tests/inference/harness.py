"""An activator, controller and embedded scheduler in one event loop, on a fake store,
with the real model server (model_server.py) as replicas, started through the host
launcher as the service owner's account (made for the test as root and removed after)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from hub_ext.host.accounts import Accounts, default_mode
from hub_ext.host.process import Launcher
from hub_ext.serving.embedded import EmbeddedBackend
from hub_ext.serving.spec import parse_spec
from inference.activator import Server
from inference.controller import Controller
from scheduler.embedded.adapter import EmbeddedScheduler
from scheduler.model import DEFAULT_POOL, GPU, Department, Node, Project, Quota

MODEL_SERVER = str(Path(__file__).with_name("model_server.py"))
NODE = Node("n", [GPU(i, "H100", 81920) for i in range(2)])
# the test accounts' prefix: this run's own (tests/conftest.py), apart from its hubs' accounts
PREFIX = os.environ.get("GPUPOOL_TEST_ACCOUNT_PREFIX", "gpt-") + "i-"
OWNER = "alice"


class FakeStore:
    """scheduler.embedded.adapter.Store with one project ``p`` of ``quota`` GPUs."""

    def __init__(self, quota: float = 2.0):
        self.quota = quota
        self.events: list = []

    def version(self):
        return 1

    def load_org(self):
        return ([Department("d", {DEFAULT_POOL: Quota(2)})],
                [Project("p", "d", {DEFAULT_POOL: Quota(self.quota)})])

    def load_workloads(self):
        return []

    def record(self, decisions, snapshot):
        pass

    def set_state(self, name, state, **fields):
        pass

    def finish_stop(self, name):
        pass

    def event(self, kind, message, workload="", project=""):
        self.events.append((kind, workload))


def service(name="svc", startup_s=0.3, delay_ms=0.0, **over) -> dict:
    d = {"name": name, "project": "p", "gpu": 0.25, "owner": OWNER,
         "command": [sys.executable, MODEL_SERVER, "--startup-s", str(startup_s),
                     "--delay-ms", str(delay_ms)],
         "ready_path": "/health", "stable_window_s": 2.0, "scale_to_zero_after_s": 1.0,
         "target": 10}
    d.update(over)
    return d


@dataclass
class Stack:
    sched: EmbeddedScheduler
    controller: Controller
    url: str
    http: aiohttp.ClientSession
    accounts: Accounts
    state: Path

    def put(self, **spec):
        return self.controller.put(parse_spec(service(**spec)))

    def replicas_in_scheduler(self, svc: str) -> dict:
        return {n: w for n, w in self.sched.snapshot.workloads.items() if n.startswith(svc + "-")}

    def allocated_milli(self) -> int:
        return sum(w.allocated_milli() for w in self.sched.snapshot.workloads.values())


@contextlib.asynccontextmanager
async def stack(quota: float = 2.0, tick_s: float = 0.1, auth=None, state: Path | None = None):
    """``state``: the run folder and replica records of an earlier stack (a hub started
    again); a new one when None."""
    sched = EmbeddedScheduler(FakeStore(quota), [NODE], period_s=0.05)
    sched.start()
    await sched.cycle()  # take in the organisation
    state = state or Path(tempfile.mkdtemp(prefix="gpupool-test-inference-"))
    accounts = Accounts(mode=default_mode(), prefix=PREFIX)
    backend = EmbeddedBackend(sched, launcher=Launcher(state / "run"), accounts=accounts,
                              state_dir=state / "inference", grace_s=2.0)
    controller = Controller(backend, tick_s=tick_s)
    controller.start()
    server = Server(controller, "/serve/", auth)
    port = await server.listen(0)
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=120)) as http:
        try:
            yield Stack(sched, controller, f"http://127.0.0.1:{port}/serve", http, accounts, state)
        finally:
            server.close()
            await controller.stop()
            await sched.stop()
            if accounts.mode == "create":
                accounts.remove(OWNER)
            shutil.rmtree(backend.launcher.regions, ignore_errors=True)
            shutil.rmtree(state, ignore_errors=True)


async def until(cond, timeout: float = 60.0, every: float = 0.05, what: str = "condition"):
    """Wait for a condition (no timing is asserted: the bound only stops a hung test)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not cond():
        if loop.time() > end:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(every)
