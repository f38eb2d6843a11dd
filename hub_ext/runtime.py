"""The hub-side runtime: database, GPU inventory, the embedded scheduler loop, the
launcher for trainings/inferences and the allocation sampler. One per hub process."""

from __future__ import annotations

import asyncio
import logging
import os
import pwd
import re
import sys
import time
from pathlib import Path

from sqlalchemy import delete, func, select

from gpupool.errors import GpupoolError
from scheduler.embedded import EmbeddedScheduler, gpu_env, terminate
from scheduler.model import MILLI, Bind, Workload

from . import accounting, attach, credentials, datasources, org, roles
from .config import Gpupool
from .db import GpuSampleRow, SampleRow, WorkloadRow
from .host.accounts import Accounts
from .host.cgroups import detect as detect_cgroups
from .host.process import Launcher
from .inventory import discover, gpu_utilization
from .limits import limits_for
from .requests import FieldError, Limits
from .schema import make_sessionmaker
from .store import DbStore, placement_json
from .training.runner import JobRunner

log = logging.getLogger("gpupool")
_WORKER = re.compile(r"(.+)-w\d+")


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
        self.nodes, self.inventory_source = discover(cfg.declared_gpus, cfg.use_nvml)
        self.store.set_nodes(self.nodes, self.inventory_source)
        # Workloads run as their owners' OS accounts under a monitor that outlives the hub
        # (hub_ext.host); what still runs from before a restart is kept, not dropped.
        if cfg.accounts == "personal" and os.geteuid() == 0:
            raise GpupoolError("Gpupool.accounts = 'personal' would run every workload as root: "
                               "use 'create' or 'existing' when the hub runs as root")
        self.accounts = Accounts(cfg.accounts, prefix=cfg.account_prefix, home_root=cfg.home_root,
                                 template=cfg.account_template or None)
        self.cgroups = detect_cgroups()
        self.launcher = Launcher(state / "run", self.cgroups)
        running = self.surviving_workloads()
        with self.Session() as s:
            accounting.close_open_allocations(s, running=running)
            s.commit()
        self.store.reset_after_restart(running)
        self._startup_log()
        self.scheduler = EmbeddedScheduler(self.store, self.nodes, cfg.schedule_period_s)
        self.scheduler.launch = self._launch_process
        # credentials and data sources reach workloads through this one object (attach.py)
        self.delivery = attach.Delivery(self.Session, credentials.vault_for(cfg), cfg.state_dir)
        self.trainings = JobRunner(self.scheduler, self.Session, self.nodes, cfg.state_dir, cfg.preload_library,
                                   delivery=self.delivery)
        self._started = False

    def surviving_workloads(self) -> set[str]:
        """Workloads with a process still running from before a restart (a training's
        workers are named JOB-wRANK)."""
        names = set()
        for n in self.launcher.names():
            h = self.launcher.adopt(n)
            if h is not None and h.alive():
                m = _WORKER.fullmatch(n)
                names.add(m.group(1) if m else n)
        return names

    def _startup_log(self) -> None:
        if self.accounts.mode == "personal":
            log.warning("gpupool: personal mode: %s", personal_notice())
        else:
            log.info("gpupool: workloads run as per-user accounts (%s mode)", self.accounts.mode)
            for problem in unreachable(Path(sys.executable)):
                log.warning("gpupool: %s", problem)
        if not self.cgroups.enforced:
            log.warning("gpupool: CPU and memory limits are not enforced: %s", self.cgroups.reason)

    def gpu_devices(self, b: Bind) -> tuple[str, ...]:
        """The indices of a placement's GPUs: the device cgroup opens only their /dev/nvidiaN."""
        return tuple(str(i) for p in b.pods for i in p.gpu_indices)

    @classmethod
    def instance(cls, cfg: Gpupool | None = None) -> Runtime:
        if cls._instance is None:
            cls._instance = cls(cfg or Gpupool())
        return cls._instance

    def start(self) -> None:
        if not self._started:
            self._started = True
            self.scheduler.start()
            self.trainings.start()
            asyncio.ensure_future(self._sample_loop())

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
        free_gpus = self._free_per_gpu()
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

    def _free_per_gpu(self) -> list[int]:
        free = {(n.name, g.index): MILLI for n in self.nodes for g in n.gpus}
        for w in self.scheduler.snapshot.workloads.values():
            for p in w.placement:
                for i in p.gpu_indices:
                    free[(p.node, i)] = free.get((p.node, i), MILLI) - p.gpu_milli
        return list(free.values())

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

    def env_for(self, w: Workload, b: Bind) -> dict:
        pod = b.pods[0]
        node = next(n for n in self.nodes if n.name == pod.node)
        return gpu_env(node, pod, w.demand.gpu_memory_mib, self.cfg.preload_library, w.name)

    # -- trainings and inferences submitted through the API ------------------------------
    async def _launch_process(self, w: Workload, b: Bind):
        row = self.store.get(w.name)
        if row is None:
            return None
        cmd = row.spec.get("command") or []
        workdir = Path(self.cfg.state_dir) / "workloads" / w.name
        workdir.mkdir(parents=True, exist_ok=True)
        try:
            attached = self.delivery.env(w.name, row.owner, w.project, row.spec.get("credentials") or [],
                                         row.spec.get("datasources") or [], workdir)
        except FieldError as e:
            self.store.set_state(w.name, "failed", reason=f"could not start: {e}", placement=[])
            self.scheduler.release(w.name, "failed to start")
            return None
        env = {**os.environ, **self.env_for(w, b), "GPUPOOL_WORKLOAD": w.name,
               "GPUPOOL_PROJECT": w.project, "GPUPOOL_CHECKPOINT_DIR": str(workdir), **attached}
        env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
        logf = open(workdir / "output.log", "ab")  # noqa: SIM115 (closed when the process exits)
        try:
            proc = await asyncio.create_subprocess_exec(
                *cmd, cwd=workdir, env=env, stdout=logf, stderr=logf, start_new_session=True
            )
        except (OSError, ValueError, TypeError) as e:  # no such program, a NUL byte, no command
            logf.close()
            self.delivery.cleanup(w.name)
            self.store.set_state(w.name, "failed", reason=f"could not start: {e}", placement=[], pid=None)
            self.store.event("failed", f"{w.name} could not start: {e}", w.name, w.project)
            self.scheduler.release(w.name, "failed to start")
            return None
        # With its placement in the same write: the cycle records its binds only after every
        # launch, and a reader in between must not see "running" without GPUs.
        self.store.set_state(w.name, "running", pid=proc.pid, placement=placement_json(b.pods), over_quota=b.over_quota)

        async def watch():
            code = await proc.wait()
            logf.close()
            self.delivery.cleanup(w.name)
            current = self.store.get(w.name)
            if current is not None and current.state == "releasing":
                self.scheduler.requeue(w.name)  # preempted: back in the queue
                return
            state = "succeeded" if code == 0 else "failed"
            if current is not None and current.state == "stopping":
                state = "stopped"
            self.store.set_state(w.name, state, reason=f"exit code {code}", placement=[], pid=None)
            self.scheduler.release(w.name, state)

        asyncio.ensure_future(watch())

        async def evict(grace_s: float) -> None:
            await terminate(proc.pid, grace_s, lambda: proc.returncode is None)

        return evict

    # -- allocation / utilization over time ----------------------------------------------
    async def _sample_loop(self) -> None:
        while True:
            try:
                self.sample()
            except Exception:
                log.exception("sampling failed")
            await asyncio.sleep(self.cfg.sample_period_s)

    def sample(self) -> None:
        capacity = sum(len(n.gpus) for n in self.nodes) * MILLI
        allocated = sum(w.allocated_milli() for w in self.scheduler.snapshot.workloads.values())
        util = gpu_utilization()
        pct = sum(util.values()) / len(util) if util else None
        with self.Session() as s:
            now = time.time()
            s.add(SampleRow(ts=now, capacity_milli=capacity, allocated_milli=allocated,
                            utilization_pct=pct))
            if util and self.inventory_source == "nvml":  # one local node (inventory.discover)
                for i, u in util.items():
                    s.add(GpuSampleRow(ts=now, node=self.nodes[0].name, gpu_index=i, utilization_pct=u))
            # keep about a week at the default period
            n = s.scalar(select(func.count()).select_from(SampleRow))
            if n and n > 60_000:
                oldest = s.scalar(select(SampleRow.ts).order_by(SampleRow.ts).offset(n - 60_000).limit(1))
                s.execute(delete(SampleRow).where(SampleRow.ts < oldest))
                s.execute(delete(GpuSampleRow).where(GpuSampleRow.ts < oldest))
            s.commit()

    def workload_row(self, name: str) -> WorkloadRow | None:
        return self.store.get(name)


def personal_notice() -> str:
    """Why only one person may log in when the hub is not root (shown in the log and on the
    login page)."""
    me = pwd.getpwuid(os.geteuid()).pw_name
    return (f"this hub runs as {me}, not root, so it cannot start work as other accounts: "
            f"every workload runs as {me}, and only {me} may log in")


def unreachable(path: Path) -> list[str]:
    """Why other accounts could not run ``path``: a folder on the way they may not enter."""
    for folder in path.resolve().parents:
        mode = folder.stat().st_mode
        if not mode & 0o001:
            why = (f"{folder} (mode {mode & 0o777:o}) is closed to other accounts, so their "
                   f"workloads cannot run {path}: install gpupool where every account may read it")
            return [why]
    return []
