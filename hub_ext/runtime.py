"""The hub-side runtime: the database, the organisation's starter file, the delivery of
credentials and data sources, and the mode's backend ``Gpupool.backend`` chooses
(``hub_ext.backends``), built once here. One per hub process."""

from __future__ import annotations

from pathlib import Path

from gpupool.errors import GpupoolError
from scheduler.model import MILLI

from .attachments import attach, credentials, datasources
from .backends import Backend, build
from .backends.embedded import EmbeddedMode
from .config import Gpupool
from .db.tables import WorkloadRow
from .org import projects as org
from .org import roles
from .requests.limits import limits_for
from .requests.rules import Limits
from .requests.store import DbStore
from .schema import make_sessionmaker


class Runtime:
    _instance: Runtime | None = None

    def __init__(self, cfg: Gpupool):
        self.cfg = cfg
        state = Path(cfg.state_dir)
        state.mkdir(parents=True, exist_ok=True, mode=0o700)
        state.chmod(0o700)  # the hub's secrets and databases: no workload account may look in
        self.Session = make_sessionmaker(cfg.db_url)
        self.store = DbStore(self.Session)
        with self.Session() as s:
            self.org_file = org.load_starter(s, cfg.org_file)
        # credentials and data sources reach workloads through this one object (attach.py)
        self.delivery = attach.Delivery(self.Session, credentials.vault_for(cfg), cfg.state_dir)
        self._started = False
        self.backend: Backend = build(cfg, self.Session, self.store, self.delivery)

    @property
    def embedded(self) -> EmbeddedMode:
        """The backend, for what only the embedded mode has (its scheduler, launcher and
        accounts: ``GpupoolLocalSpawner``)."""
        if not isinstance(self.backend, EmbeddedMode):
            raise GpupoolError(f"Gpupool.backend is {self.cfg.backend!r}: no embedded scheduler here")
        return self.backend

    @classmethod
    def instance(cls, cfg: Gpupool | None = None) -> Runtime:
        if cls._instance is None:
            cls._instance = cls(cfg or Gpupool())
        return cls._instance

    def start(self) -> None:
        if not self._started:
            self._started = True
            self.backend.start()

    # -- what the form and the rules need ------------------------------------------------
    def limits(self, user: str, scopes=()) -> Limits:
        """The request rules' limits; the projects are those hub_ext.roles lets ``user`` (with
        these JupyterHub scopes) submit to."""
        with self.Session() as s:
            who = roles.who_for(s, {"name": user, "scopes": list(scopes)})
            return limits_for(s, self.cfg, user, projects=tuple(roles.submit_projects(who)))

    def project_status(self, projects: tuple[str, ...]) -> dict:
        """Per project: quota, limit, GPUs in use, and GPUs free in the cluster."""
        with self.Session() as s:
            rows = [p for p in org.list_projects(s) if p["name"] in projects]
            capacity = org.capacity_gpus(s)
            allocated = sum(u["allocated_gpus"] for u in org.usage(s).values())
        free_gpus = self.backend.free_per_gpu()
        return {
            "capacity": capacity,
            "free": round(capacity - allocated, 3),
            "largest_free_fraction": max(free_gpus, default=0) / MILLI,
            "whole_free": sum(1 for f in free_gpus if f >= MILLI),
            "projects": {
                p["name"]: {
                    "quota": p["gpus"], "limit": p["limit"], "used": p["allocated_gpus"],
                    "pending": p["pending"], "department": p["department"],
                }
                for p in rows
            },
        }

    def attachables(self, projects) -> dict[str, dict[str, list[str]]]:
        """Per project: the names of its credentials and data sources (the spawn form)."""
        with self.Session() as s:
            creds = credentials.names_by_project(s, projects)
            sources = datasources.names_by_project(s, projects)
        return {p: {"credentials": creds[p], "datasources": sources[p]} for p in projects}

    def attach_check(self, actor: str, workload: str, req) -> None:
        """Check a submitted request's credentials and data sources; audit the attach."""
        if not req.credentials and not req.datasources:
            return
        with self.Session() as s:
            att = attach.check(s, req.project, req.credentials, req.datasources)
            attach.record_use(s, actor, workload, att, "attach")
            s.commit()

    def workload_row(self, name: str) -> WorkloadRow | None:
        return self.store.get(name)
