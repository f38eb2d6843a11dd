"""Replicas as local processes, placed by the embedded scheduler.

Each replica is a workload of kind inference (highest priority, non-preemptible, in quota
only) submitted through ``EmbeddedScheduler.submit`` -- the same extension point the
spawner uses: the scheduler binds it and wakes our waiter, and we start the model server
through the host launcher (``hub_ext.host.process``) as the service owner's account, with
an environment built from scratch (``hub_ext.launch``) plus the GPU environment of the
placement (``gpu_env``). While it waits, the core's pending reason is the replica's reason.
Stopping terminates the process and releases the workload at once, so its GPU share is
free in the scheduler's snapshot before ``stop`` returns.

Where a replica listens:

- ``{socket}`` in the command: a unix socket in a 0700 folder of the owner's account
  (``~/.gpupool/sock/DIGEST/s``: short, as a socket's path must be), also in
  ``$GPUPOOL_SOCKET``. Only that account and the
  activator (the hub's root) can connect: every request passes the activator's token check.
- otherwise TCP on 127.0.0.1 at ``$PORT`` (``{port}`` in the command is replaced too): any
  local account can connect to it, skipping the activator.

Replicas outlive the hub: ``adopt`` takes one back after a restart (its record in
STATE_DIR/inference says where it listens) and it is routed to again once it answers the
probe. ``rows`` (optional, the hub's ``DbStore``) gets a workload row per replica so that
the admin panel and ``GET /workloads`` show them and the loop's database sync keeps them.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import socket
from pathlib import Path

from gpupool.errors import GpupoolError
from hub_ext.host import launch
from hub_ext.host.accounts import Account, Accounts
from hub_ext.host.cgroups import Limits
from hub_ext.host.process import Handle, Launcher, Spec
from hub_ext.requests.rules import WorkloadRequest
from hub_ext.requests.store import placement_from_json
from inference.service import Replica, RState, Service
from scheduler.embedded.adapter import EmbeddedScheduler, gpu_env
from scheduler.model import MILLI, Bind, Kind, State, ValidationError, Workload

SOCKET = "{socket}"
MAX_SOCKET_PATH = 107  # sockaddr_un.sun_path less its NUL


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


async def probe(host: str, port: int, path: str, timeout: float = 2.0, unix: str = "") -> bool:
    """True once the server (at ``unix``, a socket path, when given) answers ``path``
    with a status under 500."""
    try:
        opening = asyncio.open_unix_connection(unix) if unix else asyncio.open_connection(host, port)
        r, w = await asyncio.wait_for(opening, timeout)
    except (OSError, asyncio.TimeoutError):
        return False
    try:
        where = "localhost" if unix else f"{host}:{port}"
        w.write(f"GET {path} HTTP/1.1\r\nHost: {where}\r\nConnection: close\r\n\r\n".encode())
        line = await asyncio.wait_for(r.readline(), timeout)
        parts = line.split()
        return len(parts) >= 2 and parts[1].isdigit() and int(parts[1]) < 500
    except (OSError, asyncio.TimeoutError):
        return False
    finally:
        w.close()


class _Handle:
    def __init__(self):
        self.proc: Handle | None = None
        self.task: asyncio.Task | None = None
        self.account: Account | None = None
        self.stopping = False
        self.released = False


class EmbeddedBackend:
    def __init__(self, scheduler: EmbeddedScheduler, *, launcher: Launcher, accounts: Accounts,
                 state_dir: str | Path, rows=None, preload: str = "", host: str = "127.0.0.1",
                 probe_every_s: float = 0.01, grace_s: float = 10.0, delivery=None):
        self.scheduler = scheduler
        self.launcher, self.accounts = launcher, accounts
        self.delivery = delivery  # hub_ext.attach.Delivery: credentials and data sources
        self.rows = rows
        self.preload = preload
        self.host = host
        self.probe_every_s = probe_every_s
        self.records = Path(state_dir)  # the hub's: REPLICA.json says where it listens
        self.grace_s = grace_s

    def start(self, service: Service, replica: Replica) -> None:
        h = replica.handle = _Handle()
        h.task = asyncio.ensure_future(self._run(service, replica, h))

    async def stop(self, service: Service, replica: Replica) -> None:
        h: _Handle = replica.handle
        h.stopping = True
        if h.proc is not None and h.proc.alive():
            await h.proc.terminate(self.grace_s)
        elif h.task is not None and not h.task.done():
            h.task.cancel()
        self._release(replica, "scaled down")

    # -- after a hub restart ---------------------------------------------------------------
    def adopt(self, svc: Service, r: Replica, row) -> bool:
        """Take back replica ``r`` (its workload ``row``) that outlived the hub: True when
        its process still runs at its stored placement; else it is discarded."""
        proc = self.launcher.adopt(r.name)
        try:
            where = json.loads((self.records / f"{r.name}.json").read_text())
        except (OSError, ValueError):
            where = None
        if proc is None or not proc.alive() or where is None or not row.placement:
            self.discard(r.name)
            return False
        h = r.handle = _Handle()
        h.proc = proc
        w = self._workload(svc, r)
        w.state = State.RUNNING
        w.placement = placement_from_json(row.placement)
        try:
            h.account = self.accounts.for_user(svc.spec.owner or "inference")
            self.scheduler.adopt(w, lambda grace: self._evicted(h, grace))
        except (ValidationError, GpupoolError):  # its node is gone; no account
            self.discard(r.name)
            return False
        r.where = _where(w.placement[0])
        r.state, r.reason = RState.STARTING, "adopted after a hub restart; waiting for it to answer"
        h.task = asyncio.ensure_future(self._serve(svc, r, h, where["port"], where["socket"]))
        return True

    def discard(self, name: str) -> None:
        """A replica left from before a hub restart that is not taken back: its process (if
        any) ends, its row, record and GPU share go."""
        proc = self.launcher.adopt(name)
        if proc is not None:
            asyncio.ensure_future(launch.reap(self.launcher, proc))
        if name in self.scheduler.snapshot.workloads:  # a cycle took its row in already
            self.scheduler.release(name, "gone after a hub restart")
        with contextlib.suppress(OSError):
            (self.records / f"{name}.json").unlink()
        self._drop_row(name)

    # -- one replica's life ----------------------------------------------------------------
    def _workload(self, svc: Service, r: Replica) -> Workload:
        return Workload(r.name, svc.spec.project, Kind.INFERENCE, svc.spec.demand(), grace_period_s=self.grace_s)

    async def _run(self, svc: Service, r: Replica, h: _Handle) -> None:
        spec = svc.spec
        w = self._workload(svc, r)
        if self.rows is not None:
            frac = spec.gpu < 1
            self.rows.add_workload(r.name, spec.owner or "inference", WorkloadRequest(
                project=spec.project, kind="inference", gpu_mode="fraction" if frac else "whole",
                gpu_fraction=spec.gpu if frac else 0.25, gpus=0 if frac else int(spec.gpu),
                command=list(spec.command), name=r.name), notify=False)
        try:
            waiter = self.scheduler.submit(w, evict=lambda grace: self._evicted(h, grace))
        except ValidationError as e:
            return self._gone(svc, r, f"cannot be placed: {e}")
        try:
            while not waiter.bound.done():
                get = asyncio.ensure_future(waiter.updates.get())
                await asyncio.wait({waiter.bound, get}, return_when=asyncio.FIRST_COMPLETED)
                if get.done():
                    p = get.result()
                    r.reason = f"{p.reason} (queue position {p.queue_position})"
                else:
                    get.cancel()
            bind = waiter.bound.result()
        except asyncio.CancelledError:
            return  # stopped (or released) before it was placed
        r.where = _where(bind.pods[0])
        r.state, r.reason = RState.STARTING, "model server starting"
        try:
            port, unix = await self._launch(svc, r, h, bind)
        except (OSError, ValueError, TypeError, GpupoolError) as e:  # FieldError, AccountError, LaunchError
            return self._gone(svc, r, f"could not start {spec.command[0]!r}: {e}")
        if self.rows is not None:
            self.rows.set_state(r.name, "running", pid=h.proc.pid)
        await self._serve(svc, r, h, port, unix)

    async def _launch(self, svc: Service, r: Replica, h: _Handle, bind: Bind) -> tuple[int, str]:
        """Start the model server as the owner's account: where it listens (port, socket)."""
        spec = svc.spec
        pod = bind.pods[0]
        node = self.scheduler.snapshot.nodes[pod.node]
        account = h.account = self.accounts.for_user(spec.owner or "inference")
        folder = launch.private_dir(account, "serve", r.name)
        attached = {}
        if self.delivery is not None and (spec.credentials or spec.datasources):
            attached = self.delivery.env(r.name, spec.owner, spec.project, spec.credentials,
                                         spec.datasources, account=account)
        env = {**launch.account_env(account), **spec.env, **gpu_env(node, pod, 0, self.preload, self.launcher.region(r.name)),
               "GPUPOOL_WORKLOAD": r.name, "GPUPOOL_PROJECT": spec.project,
               "GPUPOOL_INFERENCE_SERVICE": spec.name, **attached}
        port, unix = 0, ""
        if any(SOCKET in c for c in spec.command):
            unix = socket_path(account, r.name)
            env["GPUPOOL_SOCKET"] = unix
            cmd = [c.replace(SOCKET, unix) for c in spec.command]
        else:
            port = free_port(self.host)
            env["PORT"] = str(port)
            cmd = [c.replace("{port}", str(port)) for c in spec.command]
        launch.check_argv(cmd, env)
        self.records.mkdir(mode=0o700, parents=True, exist_ok=True)
        (self.records / f"{r.name}.json").write_text(json.dumps({"port": port, "socket": unix}))
        h.proc = await launch.start(self.launcher, Spec(
            name=r.name, argv=cmd, env=env, cwd=folder, account=account,
            limits=Limits(cpu=None, memory_bytes=None, gpu_devices=launch.gpu_devices(node, pod)),
            log_path=launch.output_log(account.home, "replica", r.name)))
        return port, unix

    async def _serve(self, svc: Service, r: Replica, h: _Handle, port: int, unix: str) -> None:
        """Route to the replica once it answers its probe; report its end."""
        proc = h.proc
        while proc.alive() and not h.stopping:
            if await probe(self.host, port, svc.spec.ready_path, unix=unix):
                if not h.stopping:
                    svc.replica_ready(r, self.host, port, unix)
                break
            await asyncio.sleep(self.probe_every_s)
        end = await proc.wait()
        await launch.forget(self.launcher, proc)
        if not h.stopping:
            log = proc_log(h, r)
            self._gone(svc, r, f"model server {end.describe()}" + (f" (log: {log})" if log else ""))

    def _gone(self, svc: Service, r: Replica, reason: str) -> None:
        svc.replica_gone(r, RState.FAILED, reason)
        self._release(r, "failed")
        svc.on_activate(svc)  # the controller replaces it

    def _release(self, r: Replica, reason: str) -> None:
        h: _Handle = r.handle
        if h.released:
            return
        h.released = True
        self.scheduler.release(r.name, reason)
        with contextlib.suppress(OSError):
            (self.records / f"{r.name}.json").unlink()
        if self.delivery is not None:
            self.delivery.cleanup(r.name, h.account)
        if h.account is not None:
            with contextlib.suppress(OSError):  # a link the account put there: its own tree
                launch.remove_private(h.account, "sock", _digest(r.name))
        self._drop_row(r.name)

    def _drop_row(self, name: str) -> None:
        if self.rows is not None:
            with contextlib.suppress(Exception):
                self.rows.remove_workload(name)

    async def _evicted(self, h: _Handle, grace_s: float) -> None:
        if h.proc is not None and h.proc.alive():
            await h.proc.terminate(grace_s)


def socket_path(account: Account, replica: str) -> str:
    """Where a ``{socket}`` replica listens: a short path (a unix socket's is at most 107
    bytes) in a 0700 folder of the account's, ``~/.gpupool/sock/DIGEST/s``."""
    path = str(launch.private_dir(account, "sock", _digest(replica)) / "s")
    if len(path.encode()) > MAX_SOCKET_PATH:
        raise ValueError(f"the replica's socket path {path!r} is longer than the {MAX_SOCKET_PATH} bytes "
                         "a unix socket allows (a shorter home folder, or {port} instead)")
    return path


def _digest(replica: str) -> str:
    return hashlib.sha256(replica.encode()).hexdigest()[:12]


def proc_log(h: _Handle, r: Replica) -> str:
    """Where a replica's output went (its account's folder)."""
    return str(launch.output_log(h.account.home, "replica", r.name)) if h.account else ""


def _where(pod) -> str:
    return f"{pod.node} GPU {','.join(map(str, pod.gpu_indices))} ({pod.gpu_milli / MILLI:g} each)"


__all__ = ["EmbeddedBackend", "free_port", "probe"]
