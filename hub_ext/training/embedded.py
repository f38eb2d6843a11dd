"""The training-job runner of the embedded backend (runs in the hub process).

One asyncio task per job walks its lifecycle:

    Pending --bind--> Running --all workers exit 0--> Succeeded
       ^                 |  \\--a worker fails--> (backoff) Pending ... or Failed
       |                 |        (the whole gang stops and restarts; backoff_limit)
       |            evicted: SIGTERM, grace period, SIGKILL
       |                 v
       +---------- Preempted (requeued, priority + 1) --bind--> Resuming --> Running
    suspend: Suspended (GPUs released) --resume--> Pending

The job is held in the scheduler through ``EmbeddedScheduler.submit`` with its full
workload (gang size, priority, node pool, grace period), so the scheduler's own launcher
never sees it; binds arrive on the waiter's future and evictions through the evictor the
job hands in. Workers are local processes, one per pod, started through the host launcher
(``hub_ext.host.process``) as ``JOB-wRANK`` under the owner's account, in its private folder
``~/.gpupool/workloads/JOB`` (logs ``worker-RANK.log``, default checkpoints), with an
environment built from scratch: the account's (``hub_ext.launch``), the GPU environment of
its placement (``scheduler.embedded.adapter.gpu_env``) and the ``torchrun`` environment
(``gang.py``); CPU, memory and GPU devices are limited by its cgroup. Control requests
(suspend, resume, delete) arrive from the service process through
``TrainingRow.request``; the runner polls for them and for new jobs.

Workers outlive the hub. After a restart ``recover`` adopts a running job whose workers
are all still alive (same processes, same placement, held again in the scheduler); one
whose workers ended meanwhile counts as succeeded (all exited 0) or as a failed attempt.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import time
from pathlib import Path

from gpupool.errors import GpupoolError
from scheduler.embedded.adapter import EmbeddedScheduler, gpu_env
from scheduler.model import Bind, Kind, Node, State, ValidationError, Workload

from ..db.events import add_event
from ..db.tables import WorkloadRow
from ..host import launch
from ..host.accounts import Account, Accounts
from ..host.cgroups import Limits
from ..host.process import Exit, Handle, Launcher, Spec
from ..requests.store import placement_from_json, placement_json
from .db import LOGS, SUBMITTED, TrainingRow, add_training, set_status, take_requests, worker_region
from .gang import free_port, gang_env
from .spec import TrainingSpec

log = logging.getLogger("gpupool.training")
ROOT = Path(__file__).resolve().parent.parent.parent
MAX_BACKOFF_S = 300.0


class Job:
    def __init__(self, runner: JobRunner, name: str):
        self.runner, self.name = runner, name
        self.procs: list[Handle] = []
        self.adopted = False  # workers kept running through a hub restart: watch them first
        self.account: Account | None = None  # the owner's, once known: its files are cleaned up
        self.stop: str | None = None  # preempted | suspend | delete | stopped
        self.stop_reason = ""  # a suspend's, when not a user's (a policy's)
        self.kick = asyncio.Event()
        self.task: asyncio.Task | None = None
        self.grace_s = 60.0

    # -- small helpers -------------------------------------------------------------------
    @property
    def sched(self) -> EmbeddedScheduler:
        return self.runner.scheduler

    def row(self) -> TrainingRow:
        with self.runner.Session() as s:
            return s.get(TrainingRow, self.name)

    def status(self, status: str, reason: str = "", event: str | None = None, message: str = "",
               workload_state: str | None = None, bind: Bind | None = None, **fields) -> None:
        with self.runner.Session() as s:
            set_status(s, self.name, status, reason, event, message, **fields)
            if workload_state is not None:
                values: dict = {"state": workload_state}
                if workload_state not in ("running", "releasing"):
                    values.update(placement=[], pid=None)
                elif bind is not None:  # "running" never without its GPUs (see runtime)
                    values["placement"] = placement_json(bind.pods)
                if workload_state == "pending":
                    values["reason"] = reason
                w = s.get(WorkloadRow, self.name)
                if w is not None:
                    for k, v in values.items():
                        setattr(w, k, v)
            s.commit()

    def event(self, kind: str, message: str, project: str) -> None:
        with self.runner.Session() as s:
            add_event(s, kind, message, self.name, project)
            s.commit()

    def request(self, what: str, reason: str = "") -> None:
        """suspend | resume | delete | preempted | stopped (from the evictor). ``reason``:
        why a suspend was asked, when not by a user."""
        if what == "resume":
            if self.stop == "suspend":
                self.stop = None
        else:
            self.stop = self.stop if self.stop == "delete" else what
            if what == "suspend":
                self.stop_reason = reason
        self.kick.set()

    async def evict(self, grace_s: float) -> None:
        """The scheduler's evictor: a preemption (the workload is releasing) or a stop
        through the hub's workload API (the row left the active states)."""
        w = self.sched.snapshot.workloads.get(self.name)
        self.grace_s = grace_s
        self.request("preempted" if w is not None and w.state == State.RELEASING else "stopped")

    # -- the lifecycle -------------------------------------------------------------------
    async def run(self) -> None:
        try:
            await self._run()
        except asyncio.CancelledError:
            await self._terminate(0)
            raise
        except Exception as e:  # never leave a job in limbo
            log.exception("training %s", self.name)
            await self._terminate(0)
            self.sched.release(self.name, "failed")
            self.status("Failed", f"internal error: {e}", "failed", workload_state="failed")
        finally:
            self.runner.jobs.pop(self.name, None)
            if self.runner.delivery is not None:
                self.runner.delivery.cleanup(self.name, self.account)

    async def _run(self) -> None:
        while True:
            t = self.row()
            if t is None:
                return
            spec = TrainingSpec.from_dict(t.spec)
            self.grace_s = spec.grace_period_s
            if self.adopted:
                self.adopted = False
                if await self._outcome(t, spec, await self._watch()) == "done":
                    return
                continue
            if self.stop == "delete":
                return self._delete()
            if self.stop in ("suspend", "stopped"):
                await self._suspended(t)
                continue
            bind = await self._queue(t, spec)
            if bind is False:
                return
            if bind is None:
                continue
            outcome = await self._attempt(t, spec, bind)
            if outcome == "done":
                return

    async def _queue(self, t: TrainingRow, spec: TrainingSpec) -> Bind | None | bool:
        """Hold the job in the scheduler until it is placed: the Bind; None when a request
        stopped the wait; False when the job can never be placed (it failed)."""
        resumed = t.preemptions > 0
        w = Workload(
            name=self.name, project=t.project, kind=Kind.TRAINING, demand=spec.demand(),
            pods=spec.workers, priority=spec.priority, resumed=resumed,
            preemptible=spec.preemptible, allow_over_quota=spec.preemptible,
            node_pool=spec.node_pool, submit_time=t.created, grace_period_s=spec.grace_period_s,
        )
        try:
            waiter = self.sched.submit(w, evict=self.evict)
        except ValidationError as e:  # a gang the cluster can never hold
            self.status("Failed", str(e), "failed", workload_state="failed")
            return False
        status = "Preempted" if t.status == "Preempted" else "Pending"
        self.status(status, t.reason if t.status == status else "", workload_state="pending")
        while not waiter.bound.done():
            kick = asyncio.ensure_future(self.kick.wait())
            update = asyncio.ensure_future(waiter.updates.get())
            done, _ = await asyncio.wait({waiter.bound, kick, update}, return_when=asyncio.FIRST_COMPLETED)
            kick.cancel()
            if update in done:
                p = update.result()
                with self.runner.Session() as s:
                    row = s.get(TrainingRow, self.name)
                    if row is not None and row.reason != p.reason:
                        row.reason, row.updated = p.reason, time.time()
                        s.commit()
            else:
                update.cancel()
            if self.stop is not None and not waiter.bound.done():
                self.kick.clear()
                self.sched.release(self.name, self.stop)
                self._after_stop_while_queued()
                return None
            self.kick.clear()
        try:
            return waiter.bound.result()
        except asyncio.CancelledError:  # released under us
            return None

    def _after_stop_while_queued(self) -> None:
        if self.stop == "preempted":  # evicted while starting: just queue again
            self.stop = None

    async def _attempt(self, t: TrainingRow, spec: TrainingSpec, bind: Bind) -> str:
        resumed = t.preemptions > 0 and t.status == "Preempted"
        attempt = t.attempt + 1
        try:
            account = self.account = self.runner.accounts.for_user(t.owner)
            ckpt_dir = self.runner.checkpoint_dir(self.name, spec, account)
        except (OSError, GpupoolError) as e:  # AccountError; a folder of the home it cannot make
            return await self._failed_start(e)
        if resumed:
            step = _latest_step(ckpt_dir)
            where = f"checkpoint step {step}" if step is not None else "the start (no checkpoint yet)"
            self.status("Resuming", f"resuming from {where}", "resumed",
                        f"{self.name} placed again after preemption; resuming from {where}",
                        attempt=attempt)
        else:
            self.status("Running", "", "started", f"{self.name} started {spec.workers} worker"
                        f"{'s' if spec.workers > 1 else ''} (attempt {attempt})", attempt=attempt)
        try:
            await self._start_gang(spec, bind, attempt, ckpt_dir, resumed, t.owner, account)
        except (OSError, ValueError, TypeError, GpupoolError) as e:  # FieldError; a NUL byte
            return await self._failed_start(e)
        if resumed:
            self.status("Running", "", workload_state="running", bind=bind)
        else:
            with self.runner.Session() as s:
                w = s.get(WorkloadRow, self.name)
                if w is not None:
                    w.pid = self.procs[0].pid
                    s.commit()
        return await self._outcome(t, spec, await self._watch())

    async def _failed_start(self, e: Exception) -> str:
        await self._terminate(0)
        self.sched.release(self.name, "failed to start")
        self.status("Failed", f"could not start the workers: {e}", "failed", workload_state="failed")
        return "done"

    async def _outcome(self, t: TrainingRow, spec: TrainingSpec, result) -> str:
        """Act on how the gang's run ended (``_watch``): "done" or "again"."""
        if result == "ok":
            await self._forget()
            self.sched.release(self.name, "succeeded")
            self.status("Succeeded", "all workers exited 0", "succeeded", workload_state="succeeded")
            return "done"
        if result == "stop":
            t0 = time.monotonic()
            killed = await self._terminate(self.grace_s)
            took = time.monotonic() - t0
            how = f"killed after the {self.grace_s:g} s grace period" if killed else f"exited in {took:.1f} s"
            stop, self.stop = self.stop, (None if self.stop == "preempted" else self.stop)
            if stop == "preempted":
                # Requeue at once (no await from here to the submit in _queue's first lines
                # besides the status write) with priority raised one step.
                row = self.row()
                self.status("Preempted", f"evicted; workers {how}; waiting to be placed again",
                            "requeued", f"{self.name} requeued with priority {spec.priority + 1} "
                            f"(was {spec.priority}); workers {how}",
                            preemptions=row.preemptions + 1)
                return "again"
            self.sched.release(self.name, stop or "stopped")
            return "again"  # _run handles suspend / delete / stopped
        _, rank, end = result
        await self._terminate(spec.grace_period_s)
        self.sched.release(self.name, "failed")
        failures = t.failures + 1
        why = f"worker {rank} ended: {end.describe()}"
        self.event("oom-killed" if end.oom else "exited", f"{self.name} {why}", t.project)
        if spec.restart_policy == "Never" or failures > spec.backoff_limit:
            limit = "restart policy Never" if spec.restart_policy == "Never" else \
                f"backoff limit {spec.backoff_limit} reached"
            self.status("Failed", f"{why}; {limit}", "failed", workload_state="failed", failures=failures)
            return "done"
        delay = min(MAX_BACKOFF_S, spec.backoff_s * 2 ** (failures - 1))
        self.status("Pending", f"{why}; the gang restarts in {delay:g} s (restart {failures} of "
                    f"{spec.backoff_limit})", "restarting", workload_state="backoff", failures=failures)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.kick.wait(), delay)
        self.kick.clear()
        return "again"

    async def _suspended(self, t: TrainingRow) -> None:
        stop = self.stop
        reason = ((self.stop_reason or "suspended by a user") if stop == "suspend"
                  else "stopped through the workloads API")
        if t.status != "Suspended":
            # Stopped through the workloads API, the workload is stopped (it holds nothing);
            # the job stays Suspended, so the trainings API may still resume it.
            self.status("Suspended", reason, "suspended",
                        workload_state="suspended" if stop == "suspend" else "stopped")
        while self.stop in ("suspend", "stopped"):
            await self.kick.wait()
            self.kick.clear()
            if self.stop == "stopped":
                self.stop = "suspend"
        if self.stop is None:
            self.stop_reason = ""
            self.event("resumed", f"{self.name} resumed by a user; queued again", t.project)
            self.status("Pending", "resumed by a user", workload_state="pending")

    def _delete(self) -> None:
        self.sched.release(self.name, "deleted")
        with self.runner.Session() as s:
            t = s.get(TrainingRow, self.name)
            project = t.project if t else ""
            for row in (t, s.get(WorkloadRow, self.name)):
                if row is not None:
                    s.delete(row)
            add_event(s, "deleted", f"training {self.name} deleted", self.name, project)
            s.commit()

    # -- processes -----------------------------------------------------------------------
    async def _start_gang(self, spec: TrainingSpec, bind: Bind, attempt: int, ckpt_dir: Path,
                          resumed: bool, owner: str, account: Account) -> None:
        if self.runner.reaping:  # the same names may be taken again only once those are gone
            await asyncio.gather(*self.runner.reaping)
        workdir = self.runner.workdir(self.name, account)
        attached = {}  # credentials and data sources (attach.py), once per gang start
        if self.runner.delivery is not None:
            attached = self.runner.delivery.env(self.name, owner, spec.project, spec.credentials,
                                                spec.datasources, workdir, account=account)
        port = free_port()
        dist = gang_env(bind.pods, "127.0.0.1", port, attempt - 1, f"{self.name}-{attempt}")
        demand = spec.demand()
        specs = []
        for rank, pod in enumerate(bind.pods):
            node = self.runner.nodes[pod.node]
            env = {
                **launch.account_env(account), **spec.env, **dist[rank],
                **gpu_env(node, pod, demand.gpu_memory_mib, self.runner.preload,
                          self.runner.launcher.region(worker_region(self.name, rank))),
                "GPUPOOL_WORKLOAD": self.name, "GPUPOOL_PROJECT": spec.project,
                "GPUPOOL_CHECKPOINT_DIR": str(ckpt_dir), "GPUPOOL_ATTEMPT": str(attempt),
                "GPUPOOL_RESUMED": "1" if resumed else "0", **attached,
            }
            # gpupool's own package (gpupool.checkpoint) importable in every worker
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), spec.env.get("PYTHONPATH")]))
            launch.check_argv(list(spec.command), env)
            limits = Limits(cpu=spec.cpu, memory_bytes=int(spec.memory_gib * 2**30),
                            gpu_devices=launch.gpu_devices(node, pod))
            specs.append(Spec(name=worker_name(self.name, rank), argv=list(spec.command), env=env,
                              cwd=workdir, account=account, limits=limits,
                              log_path=workdir / f"worker-{rank}.log"))
        self.procs = []
        for rank, worker in enumerate(specs):
            launch.log_header(account, ("workloads", self.name), worker.log_path.name,
                              f"--- gpupool: attempt {attempt}, rank {rank}, {time.ctime()}\n",
                              fresh=attempt == 1)  # a job of an earlier job's name: its own log
            self.procs.append(await launch.start(self.runner.launcher, worker))

    async def _watch(self):
        """Wait until every worker exits 0 ("ok"), one fails (("failed", rank, Exit)), or
        a request or eviction arrives ("stop")."""
        waits = {asyncio.ensure_future(h.wait()): rank for rank, h in enumerate(self.procs)}
        pending = set(waits)
        ended: dict[int, Exit] = {}
        try:
            while pending:
                if self.stop is not None:
                    return "stop"
                kick = asyncio.ensure_future(self.kick.wait())
                done, pending = await asyncio.wait(pending | {kick}, return_when=asyncio.FIRST_COMPLETED)
                pending.discard(kick)
                kick.cancel()
                self.kick.clear()
                ended.update((waits[d], d.result()) for d in done if d in waits)
                if all((e := h.exit()) is not None and e.code == 0 for h in self.procs):
                    return "ok"  # finished, even if a stop arrived at the same time
                if self.stop is not None:
                    return "stop"
                for rank in sorted(ended):
                    if ended[rank].code != 0:
                        return ("failed", rank, ended[rank])
            return "ok"
        finally:
            for f in pending:
                f.cancel()

    async def _terminate(self, grace_s: float) -> bool:
        """SIGTERM every worker's process group, SIGKILL whatever is left in its cgroup
        after the grace period. Returns whether SIGKILL was needed."""
        alive = [h for h in self.procs if h.alive()]
        if alive:
            await asyncio.gather(*(h.terminate(grace_s or 0.01) for h in alive))
        killed = any((e := h.exit()) is not None and e.signal == signal.SIGKILL for h in alive)
        await self._forget()
        return killed

    async def _forget(self) -> None:
        """The workers' ends are handled: the launcher may drop what it keeps of them."""
        procs, self.procs = self.procs, []
        await asyncio.gather(*(launch.forget(self.runner.launcher, h) for h in procs))


def worker_name(job: str, rank: int) -> str:
    """The launcher's name of one worker process."""
    return f"{job}-w{rank}"


def _latest_step(ckpt_dir: Path) -> int | None:
    # gpupool.checkpoint is standard library only; importing it here keeps one reader.
    from gpupool.checkpoint import latest_step

    return latest_step(ckpt_dir)


class JobRunner:
    """Runs the training jobs of the embedded backend; one per hub process."""

    def __init__(self, scheduler: EmbeddedScheduler, Session, nodes: list[Node], state_dir: str | Path,
                 preload: str = "", poll_s: float = 0.5, delivery=None, *, launcher: Launcher,
                 accounts: Accounts):
        self.scheduler, self.Session = scheduler, Session
        self.delivery = delivery  # attach.Delivery: credentials and data sources
        self.launcher, self.accounts = launcher, accounts
        self.nodes = {n.name: n for n in nodes}
        self.state_dir = Path(state_dir)
        self.preload, self.poll_s = preload, poll_s
        self.jobs: dict[str, Job] = {}
        self.reaping: list[asyncio.Future] = []  # workers recover ends: gone before a gang starts
        self._task: asyncio.Task | None = None

    def workdir(self, name: str, account: Account) -> Path:
        """The job's folder in its owner's home (the workers' cwd and logs), recorded where
        the log API finds it."""
        d = launch.private_dir(account, "workloads", name)
        record = self.state_dir / "trainings" / name
        record.mkdir(parents=True, exist_ok=True)
        (record / LOGS).write_text(json.dumps({"dir": str(d), "uid": account.uid}))
        return d

    def checkpoint_dir(self, name: str, spec: TrainingSpec, account: Account) -> Path:
        if spec.checkpoint_dir:  # the job's own choice: the workers make it as their account
            return Path(spec.checkpoint_dir)
        return launch.private_dir(account, "workloads", name, "checkpoints")

    def recover(self) -> None:
        """After a hub restart: adopt every job whose workers all outlived the hub (held
        again in the scheduler at its stored placement; the job's task settles one whose
        workers ended meanwhile); hand every other active job back to the runner's queue
        (the scheduler loop must not adopt them with the hub's simple launcher)."""
        adopted: list[Job] = []
        with self.Session() as s:
            for t in s.query(TrainingRow).filter(TrainingRow.status.notin_(("Succeeded", "Failed"))):
                w = s.get(WorkloadRow, t.name)
                try:
                    spec = TrainingSpec.from_dict(t.spec)
                except (TypeError, ValueError, KeyError) as e:  # the job's task fails it with the reason
                    log.warning("training %s cannot be adopted: %s", t.name, e)
                    spec = None
                workers = spec.workers if spec is not None else 0
                found = [self.launcher.adopt(worker_name(t.name, r)) for r in range(workers)]
                handles = [h for h in found if h is not None]
                if (spec is not None and len(handles) == workers and w is not None and w.placement
                        and w.state in ("running", "releasing") and t.status in ("Running", "Resuming")):
                    job = Job(self, t.name)
                    job.procs, job.adopted, job.grace_s = handles, True, spec.grace_period_s
                    try:
                        job.account = self.accounts.for_user(t.owner)
                        self.scheduler.adopt(self._workload(t, w, spec), job.evict)
                    except (ValidationError, GpupoolError) as e:  # its node is gone; no account
                        log.warning("training %s cannot be adopted: %s", t.name, e)
                    else:
                        w.state = "running"
                        if t.status == "Resuming":  # its workers had started: it runs
                            set_status(s, t.name, "Running")
                        adopted.append(job)
                        continue
                if handles:  # part of a gang, or asked to stop: stop what is left
                    self.reaping.append(asyncio.ensure_future(launch.reap(self.launcher, *handles)))
                if w is not None and w.state == "stopping":  # stopped through the workloads API
                    w.state, w.placement, w.pid = "stopped", [], None
                    set_status(s, t.name, "Suspended", "stopped through the workloads API", "suspended")
                    continue
                if w is not None and w.state in ("pending", "running", "releasing", "backoff"):
                    w.state, w.placement, w.pid = SUBMITTED, [], None
                if t.status in ("Running", "Resuming"):
                    set_status(s, t.name, "Pending", "the hub restarted; queued again")
            s.commit()
        for job in adopted:
            self.jobs[job.name] = job
            job.task = asyncio.ensure_future(job.run())
            log.info("training %s: adopted its %d running worker(s)", job.name, len(job.procs))

    @staticmethod
    def _workload(t: TrainingRow, w: WorkloadRow, spec: TrainingSpec) -> Workload:
        """The scheduler's view of a job running at its stored placement."""
        return Workload(
            name=t.name, project=t.project, kind=Kind.TRAINING, demand=spec.demand(),
            pods=spec.workers, priority=spec.priority, resumed=t.preemptions > 0,
            preemptible=spec.preemptible, allow_over_quota=spec.preemptible,
            node_pool=spec.node_pool, submit_time=t.created, grace_period_s=spec.grace_period_s,
            state=State.RUNNING, over_quota=w.over_quota, started_at=w.start_time or time.time(),
            placement=placement_from_json(w.placement),
        )

    # -- lifecycle -----------------------------------------------------------------------
    def start(self) -> None:
        if self._task is None:
            self.recover()
            self._task = asyncio.ensure_future(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None
        for job in list(self.jobs.values()):
            if job.task is not None:
                job.task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await job.task

    async def _loop(self) -> None:
        while True:
            try:
                self.poll()
            except Exception:
                log.exception("training runner poll failed")
            await asyncio.sleep(self.poll_s)

    def poll(self) -> None:
        """Take new jobs and control requests written by the service process."""
        with self.Session() as s:
            new = s.scalars(
                WorkloadRow.__table__.select().with_only_columns(WorkloadRow.name)
                .where(WorkloadRow.kind == "training", WorkloadRow.state == SUBMITTED)
            ).all()
            todo = take_requests(s)
            s.commit()
        for name in new:
            if name not in self.jobs:
                self.adopt(name)
        for name, what, reason in todo:
            self.control(name, what, reason)

    # -- in-process API (the service writes rows instead) --------------------------------
    def submit(self, owner: str, spec: TrainingSpec) -> Job:
        with self.Session() as s:
            add_training(s, owner, spec)
            s.commit()
        return self.adopt(spec.name)

    def adopt(self, name: str) -> Job:
        job = self.jobs.get(name)
        if job is None:
            job = self.jobs[name] = Job(self, name)
            job.task = asyncio.ensure_future(job.run())
        return job

    def control(self, name: str, what: str, reason: str = "") -> None:
        job = self.jobs.get(name)
        if job is not None:
            job.request(what, reason)
            return
        with self.Session() as s:  # a job no task holds: finished, or suspended before a restart
            t = s.get(TrainingRow, name)
            if t is None:
                return
            if what == "delete":
                for row in (t, s.get(WorkloadRow, name)):
                    if row is not None:
                        s.delete(row)
                add_event(s, "deleted", f"training {name} deleted", name, t.project)
                s.commit()
                return
            resume = what == "resume" and t.status == "Suspended"
        if resume:
            self.adopt(name)
