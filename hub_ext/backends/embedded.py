"""The embedded mode (``Gpupool.backend = "embedded"``, ``hub_ext.backends``): the hub places
workloads on its own GPUs (NVML or ``declared_gpus``) with ``EmbeddedScheduler`` and runs
them as processes of their owners' accounts under a monitor that outlives the hub
(``hub_ext.host``): workspaces (``GpupoolLocalSpawner``), trainings (``JobRunner``),
inference replicas and the commands the API submits. What still runs after a restart is
adopted, not dropped; the allocation sampler records GPU use over time."""

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
from scheduler.embedded.adapter import EmbeddedScheduler, gpu_env
from scheduler.model import MILLI, Bind, State, ValidationError, Workload
from scheduler.snapshot import SchedulerConfig

from ..config import Gpupool
from ..db import accounting
from ..db.tables import GpuSampleRow, SampleRow, WorkloadRow
from ..host import launch
from ..host.accounts import Account, Accounts
from ..host.activity import reader
from ..host.cgroups import Limits as HostLimits
from ..host.cgroups import detect as detect_cgroups
from ..host.inventory import discover, gpu_utilization
from ..host.launch import read_tail
from ..host.process import Handle, Launcher, Spec
from ..host.state import RUN_DIR
from ..requests.store import placement_from_json, placement_json, to_workload
from ..serving.db import replica_rows
from ..training.db import TrainingRow, worker_log
from ..training.embedded import JobRunner

log = logging.getLogger("gpupool")
_WORKER = re.compile(r"(.+)-w\d+")
LOG_BYTES = 1 << 20  # the most of a worker's log read for one answer


class EmbeddedMode:
    """The hub's backend in embedded mode (``hub_ext.backends.Backend``)."""

    spawner_class = "hub_ext.workspaces.spawner.GpupoolLocalSpawner"
    serves_inference = True
    org_in_cluster = False

    def __init__(self, cfg: Gpupool, Session, store, delivery):
        self.cfg, self.Session, self.store, self.delivery = cfg, Session, store, delivery
        state = Path(cfg.state_dir)
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
        self.launcher = Launcher(state / RUN_DIR, self.cgroups)
        running = self.surviving_workloads()
        with self.Session() as s:
            accounting.close_open_allocations(s, running=running)
            s.commit()
        self.store.reset_after_restart(running)
        self._startup_log()
        self.scheduler = EmbeddedScheduler(self.store, self.nodes, cfg.schedule_period_s,
                                           SchedulerConfig(consolidate_in_quota=cfg.consolidate_in_quota))
        self.scheduler.launch = self._launch_process
        self._reaping: list[asyncio.Future] = []  # what recover_processes ends
        self.trainings = JobRunner(self.scheduler, self.Session, self.nodes, cfg.state_dir, cfg.preload_library,
                                   delivery=self.delivery, launcher=self.launcher, accounts=self.accounts)

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

    @property
    def single_account(self) -> bool:
        return self.accounts.mode == "personal"

    def start(self) -> None:
        self.trainings.start()
        self.recover_processes()
        self.scheduler.start()
        asyncio.ensure_future(self._sample_loop())

    def replicas(self):
        """The inference controller's backend (``inference.controller.Backend``): replicas
        as processes, placed by this scheduler."""
        from ..serving.embedded import EmbeddedBackend

        return EmbeddedBackend(self.scheduler, launcher=self.launcher, accounts=self.accounts,
                               state_dir=Path(self.cfg.state_dir) / "inference", rows=self.store,
                               preload=self.cfg.preload_library, delivery=self.delivery)

    def free_per_gpu(self) -> list[int]:
        free = {(n.name, g.index): MILLI for n in self.nodes for g in n.gpus}
        for w in self.scheduler.snapshot.workloads.values():
            for p in w.placement:
                for i in p.gpu_indices:
                    free[(p.node, i)] = free.get((p.node, i), MILLI) - p.gpu_milli
        return list(free.values())

    def env_for(self, w: Workload, b: Bind) -> dict:
        pod = b.pods[0]
        node = next(n for n in self.nodes if n.name == pod.node)
        return gpu_env(node, pod, w.demand.gpu_memory_mib, self.cfg.preload_library,
                       self.launcher.region(w.name))

    # -- logs, exec, activity: the service process's, nothing built ----------------------
    @staticmethod
    async def worker_log(cfg: Gpupool, name: str, rank: int, tail: int) -> list[str]:
        where = worker_log(cfg.state_dir, name, rank)
        text = read_tail(*where, LOG_BYTES) if where else ""  # the account's file, read safely
        return text.splitlines()[-tail:]

    @staticmethod
    async def workload_log(cfg: Gpupool, name: str, kind: str, owner: str, tail: int,
                           offset: int | None, service: str = "") -> tuple[list[str], int]:
        """The owner's log file of workload ``name`` (read as that account's, safely)."""
        try:
            acct = pwd.getpwnam(Accounts(cfg.accounts, prefix=cfg.account_prefix, home_root=cfg.home_root,
                                         template=cfg.account_template or None).name_for(owner))
        except (KeyError, GpupoolError):
            return [], 0
        kinds = ["workspace"] if kind == "workspace" else ["replica", "command"]
        paths = [launch.output_log(acct.pw_dir, k, name) for k in kinds]
        path = next((p for p in paths if p.exists()), paths[-1])
        text, end = launch.read_from(path, acct.pw_uid, offset, LOG_BYTES)
        lines = text.splitlines()
        return (lines if offset is not None else lines[-tail:]), end

    @staticmethod
    async def ssh(cfg: Gpupool, Session):
        from ..ssh.embedded import EmbeddedBackend

        return EmbeddedBackend(Path(cfg.state_dir) / RUN_DIR, Session)

    @staticmethod
    def activity(cfg: Gpupool):
        return reader(cfg.state_dir)

    # -- commands submitted through the API -----------------------------------------------
    async def _launch_process(self, w: Workload, b: Bind):
        """Start a command workload through the host launcher as its owner's account, in
        ``~/.gpupool/workloads/NAME`` (cwd, ``output.log``, checkpoints)."""
        row = self.store.get(w.name)
        if row is None:
            return None
        if self._reaping:  # processes recovery ends: their names may be taken again after
            await asyncio.gather(*self._reaping)
        pod = b.pods[0]
        node = next(n for n in self.nodes if n.name == pod.node)
        try:
            account = self.accounts.for_user(row.owner)
            workdir = launch.private_dir(account, "workloads", w.name)
            attached = self.delivery.env(w.name, row.owner, w.project, row.spec.get("credentials") or [],
                                         row.spec.get("datasources") or [], workdir, account=account)
            env = {**launch.account_env(account), **self.env_for(w, b), "GPUPOOL_WORKLOAD": w.name,
                   "GPUPOOL_PROJECT": w.project, "GPUPOOL_CHECKPOINT_DIR": str(workdir), **attached}
            cmd = list(row.spec.get("command") or [])
            env, cmd = launch.in_environment(self.cfg.environments.get(row.spec.get("environment")), env, cmd)
            launch.check_argv(cmd, env)
            mem = row.spec.get("memory_gib")
            launch.log_header(account, ("workloads", w.name), "output.log", "", fresh=True)
            handle = await launch.start(self.launcher, Spec(
                name=w.name, argv=cmd, env=env, cwd=workdir, account=account,
                limits=HostLimits(cpu=row.spec.get("cpu"), memory_bytes=int(mem * 2**30) if mem else None,
                                  gpu_devices=launch.gpu_devices(node, pod)),
                log_path=launch.output_log(account.home, "command", w.name)))
        except (OSError, ValueError, TypeError, GpupoolError) as e:  # FieldError, AccountError, LaunchError
            self.delivery.cleanup(w.name)
            self.store.set_state(w.name, "failed", reason=f"could not start: {e}", placement=[], pid=None)
            self.store.event("failed", f"{w.name} could not start: {e}", w.name, w.project)
            self.scheduler.release(w.name, "failed to start")
            return None
        # With its placement in the same write: the cycle records its binds only after every
        # launch, and a reader in between must not see "running" without GPUs.
        self.store.set_state(w.name, "running", pid=handle.pid, placement=placement_json(b.pods),
                             over_quota=b.over_quota)
        return self._follow(w, handle, account)

    def _follow(self, w: Workload, handle: Handle, account: Account):
        """Watch a started (or adopted) command workload; its evictor."""

        async def watch():
            end = await handle.wait()
            await launch.forget(self.launcher, handle)
            self.delivery.cleanup(w.name, account)
            current = self.store.get(w.name)
            if current is not None and current.state == "releasing":
                self.scheduler.requeue(w.name)  # preempted: back in the queue
                return
            state = "succeeded" if end.code == 0 else "failed"
            if current is not None and current.state == "stopping":
                state = "stopped"
            if state != "succeeded":
                self.store.event("oom-killed" if end.oom else "exited", f"{w.name} {end.describe()}",
                                 w.name, w.project)
            self.store.set_state(w.name, state, reason=end.describe(), placement=[], pid=None)
            self.scheduler.release(w.name, state)

        asyncio.ensure_future(watch())

        async def evict(grace_s: float) -> None:
            await handle.terminate(grace_s)

        return evict

    def recover_processes(self) -> None:
        """After a hub restart: hold again every command workload still running (same
        process, same placement); settle one that ended while the hub was down; end one
        whose row no longer places it."""
        with self.Session() as s:
            rows = s.scalars(select(WorkloadRow).where(WorkloadRow.kind.in_(("training", "inference")))).all()
            trainings = set(s.scalars(select(TrainingRow.name)).all())
            replicas = set(replica_rows(s))  # the inference controller adopts those
            rows = [r for r in rows if r.name not in trainings and r.name not in replicas]
        for row in rows:
            handle = self.launcher.adopt(row.name)
            if row.state not in ("running", "releasing", "stopping"):
                if handle is not None:  # a process its row no longer places: it cannot go on
                    self._reaping.append(asyncio.ensure_future(launch.reap(self.launcher, handle)))
                continue
            if handle is None or not row.placement:  # nothing of ours runs it
                if row.state == "stopping":  # asked to stop before the restart: it has
                    self.store.set_state(row.name, "stopped", reason="stopped", placement=[], pid=None)
                else:
                    self.store.set_state(row.name, "failed", reason="its process was gone after a hub "
                                         "restart", placement=[], pid=None)
                continue
            try:
                w = to_workload(row)
                w.state, w.placement = State.RUNNING, placement_from_json(row.placement)
                account = self.accounts.for_user(row.owner)
                self.scheduler.adopt(w, handle.terminate)
            # its node is gone, no account, or a stored spec that is no longer valid
            except (ValidationError, GpupoolError, TypeError, ValueError, KeyError) as e:
                log.warning("workload %s cannot be adopted: %s", row.name, e)
                self._reaping.append(asyncio.ensure_future(launch.reap(self.launcher, handle)))
                self.store.set_state(row.name, "failed", reason=f"could not be adopted: {e}",
                                     placement=[], pid=None)
                continue
            self._follow(w, handle, account)  # one that ended meanwhile is settled at once
            if row.state == "stopping":  # asked to stop just before the restart
                asyncio.ensure_future(handle.terminate(w.grace_period_s))
            log.info("workload %s: adopted its running process %d", row.name, handle.pid)

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
