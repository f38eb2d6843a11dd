"""An embedded gpupool without JupyterHub for the training tests and the benchmark: a
SQLite database with an organisation, the embedded scheduler loop on the hub's DbStore,
and the training-job runner, whose workers run through the host launcher as the owner's
account (made for the test as root, the run's prefix then ``t-alice``, and removed afterwards)."""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from pathlib import Path

from sqlalchemy import select

from hub_ext.db.tables import EventRow
from hub_ext.host import launch
from hub_ext.host.accounts import Account, Accounts, default_mode
from hub_ext.host.process import Launcher
from hub_ext.org import projects as org
from hub_ext.requests.store import DbStore
from hub_ext.schema import make_sessionmaker
from hub_ext.training.db import TrainingRow
from hub_ext.training.embedded import JobRunner
from hub_ext.training.spec import TrainingSpec
from scheduler.embedded.adapter import EmbeddedScheduler
from scheduler.model import GPU, Node

SCRIPT = Path(__file__).with_name("train_linear.py")
# the test accounts' prefix: this run's own (tests/conftest.py), apart from its hubs' accounts
PREFIX = os.environ.get("GPUPOOL_TEST_ACCOUNT_PREFIX", "gpt-") + "t-"


class Cluster:
    """``projects``: name -> quota in GPUs (all in one department)."""

    def __init__(self, tmp: Path, gpus: int = 1, projects: dict[str, float] | None = None,
                 period_s: float = 0.1, restart: bool = False):
        """``restart``: the database and run folder of an earlier Cluster in ``tmp`` (a hub
        started again); else a new organisation."""
        projects = projects or {"research": 0.0, "prod": 1.0}
        self.tmp = Path(tmp)
        self.Session = make_sessionmaker(f"sqlite:///{self.tmp / 'gpupool.sqlite'}")
        with self.Session() as s:
            if restart:
                projects = {}
            if projects:
                org.create_department(s, {"name": "lab", "gpus": sum(projects.values())})
            for name, q in projects.items():
                org.create_project(s, {"name": name, "department": "lab", "gpus": q, "members": ["alice", "bob"]})
            s.commit()
        self.nodes = [Node("local", [GPU(i, "H100", 81920) for i in range(gpus)])]
        self.store = DbStore(self.Session)
        self.store.set_nodes(self.nodes, "declared")
        self.scheduler = EmbeddedScheduler(self.store, self.nodes, period_s=period_s)
        self.accounts = Accounts(mode=default_mode(), prefix=PREFIX)
        self.launcher = Launcher(self.tmp / "state" / "run")
        self.runner = JobRunner(self.scheduler, self.Session, self.nodes, self.tmp / "state", poll_s=0.1,
                                launcher=self.launcher, accounts=self.accounts)

    async def __aenter__(self) -> Cluster:
        self.scheduler.start()
        self.runner.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.runner.stop()
        await self.scheduler.stop()
        if self.accounts.mode == "create":
            self.accounts.remove("alice")
        shutil.rmtree(self.launcher.regions, ignore_errors=True)  # made again by a restart

    def account(self, user: str = "alice") -> Account:
        return self.accounts.for_user(user)

    def outbox(self, user: str = "alice") -> Path:
        """A folder the workers of ``user``'s jobs can write (their account's) and the test reads."""
        return launch.private_dir(self.account(user), "test-out")

    def submit(self, name: str, project: str, command: list[str], **kw) -> None:
        spec = TrainingSpec(name=name, project=project, command=command, **kw)
        self.runner.submit("alice", spec)

    def job(self, name: str) -> TrainingRow | None:
        with self.Session() as s:
            return s.get(TrainingRow, name)

    def status(self, name: str) -> str | None:
        t = self.job(name)
        return t.status if t else None

    async def wait_for(self, name: str, *statuses: str, timeout: float = 120.0) -> TrainingRow:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            t = self.job(name)
            if t is not None and t.status in statuses:
                return t
            await asyncio.sleep(0.02)
        raise AssertionError(f"{name} never reached {statuses}; it is {self.status(name)}: "
                             f"{self.job(name).transitions if self.job(name) else None}")

    def events(self, name: str) -> list[tuple[str, str]]:
        with self.Session() as s:
            rows = s.scalars(select(EventRow).where(EventRow.workload == name).order_by(EventRow.id)).all()
            return [(e.kind, e.message) for e in rows]
