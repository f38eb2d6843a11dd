"""Replicas as local processes, placed by the embedded scheduler.

Each replica is a workload of kind inference (highest priority, non-preemptible, in quota
only) submitted through ``EmbeddedScheduler.submit`` -- the same extension point the
spawner uses: the scheduler binds it and wakes our waiter, and we launch the model server
ourselves with the GPU environment of the placement (``gpu_env``) and ``$PORT``
(``{port}`` in the command is replaced too). While it waits, the core's pending reason is
the replica's reason. Stopping terminates the process group and releases the workload at
once, so its GPU share is free in the scheduler's snapshot before ``stop`` returns.

``rows`` (optional, the hub's ``DbStore``) gets a workload row per replica so that the
admin panel and ``GET /workloads`` show them and the loop's database sync keeps them.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import tempfile
from pathlib import Path

from hub_ext.requests import WorkloadRequest
from scheduler.embedded import EmbeddedScheduler, gpu_env, terminate
from scheduler.model import MILLI, Kind, ValidationError, Workload

from ..service import Replica, RState, Service


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


async def probe(host: str, port: int, path: str, timeout: float = 2.0) -> bool:
    """True once the server answers ``path`` with a status under 500."""
    try:
        r, w = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
    except (OSError, asyncio.TimeoutError):
        return False
    try:
        w.write(f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n\r\n".encode())
        line = await asyncio.wait_for(r.readline(), timeout)
        parts = line.split()
        return len(parts) >= 2 and parts[1].isdigit() and int(parts[1]) < 500
    except (OSError, asyncio.TimeoutError):
        return False
    finally:
        w.close()


class _Handle:
    def __init__(self):
        self.proc: asyncio.subprocess.Process | None = None
        self.task: asyncio.Task | None = None
        self.stopping = False
        self.released = False


class EmbeddedBackend:
    def __init__(self, scheduler: EmbeddedScheduler, rows=None, preload: str = "",
                 host: str = "127.0.0.1", probe_every_s: float = 0.01,
                 log_dir: str | None = None, grace_s: float = 10.0, delivery=None):
        self.scheduler = scheduler
        self.delivery = delivery  # hub_ext.attach.Delivery: credentials and data sources
        self.rows = rows
        self.preload = preload
        self.host = host
        self.probe_every_s = probe_every_s
        self.log_dir = Path(log_dir or Path(tempfile.gettempdir()) / "gpupool-inference")
        self.grace_s = grace_s

    def start(self, service: Service, replica: Replica) -> None:
        h = replica.handle = _Handle()
        h.task = asyncio.ensure_future(self._run(service, replica, h))

    async def stop(self, service: Service, replica: Replica) -> None:
        h: _Handle = replica.handle
        h.stopping = True
        if h.proc is not None and h.proc.returncode is None:
            await terminate(h.proc.pid, self.grace_s, lambda: h.proc.returncode is None)
        elif h.task is not None and not h.task.done():
            h.task.cancel()
        self._release(replica, "scaled down")

    # -- one replica's life ----------------------------------------------------------------
    async def _run(self, svc: Service, r: Replica, h: _Handle) -> None:
        spec = svc.spec
        w = Workload(r.name, spec.project, Kind.INFERENCE, spec.demand(), grace_period_s=self.grace_s)
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
        pod = bind.pods[0]
        node = self.scheduler.snapshot.nodes[pod.node]
        r.where = f"{pod.node} GPU {','.join(map(str, pod.gpu_indices))} ({pod.gpu_milli / MILLI:g} each)"
        r.state, r.reason = RState.STARTING, "model server starting"
        port = free_port(self.host)
        attached = {}
        if self.delivery is not None and (spec.credentials or spec.datasources):
            try:
                attached = self.delivery.env(r.name, spec.owner, spec.project, spec.credentials,
                                             spec.datasources)
            except ValueError as e:  # FieldError: an attachment was deleted since
                return self._gone(svc, r, f"cannot start: {e}")
        env = {**os.environ, **spec.env, **gpu_env(node, pod, 0, self.preload, r.name),
               "PORT": str(port), "GPUPOOL_WORKLOAD": r.name, "GPUPOOL_PROJECT": spec.project,
               "GPUPOOL_INFERENCE_SERVICE": spec.name, **attached}
        cmd = [c.replace("{port}", str(port)) for c in spec.command]
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_dir / f"{r.name}.log", "ab") as log:
            try:
                h.proc = await asyncio.create_subprocess_exec(
                    *cmd, env=env, stdout=log, stderr=log, start_new_session=True)
            except (OSError, ValueError) as e:  # no such program; a NUL byte stored by an older release
                return self._gone(svc, r, f"could not start {cmd[0]!r}: {e}")
        if self.rows is not None:
            self.rows.set_state(r.name, "running", pid=h.proc.pid)
        while h.proc.returncode is None and not h.stopping:
            if await probe(self.host, port, spec.ready_path):
                if not h.stopping:
                    svc.replica_ready(r, self.host, port)
                break
            await asyncio.sleep(self.probe_every_s)
        code = await h.proc.wait()
        if not h.stopping:
            self._gone(svc, r, f"model server exited with code {code} (log: {self.log_dir / r.name}.log)")

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
        if self.delivery is not None:
            self.delivery.cleanup(r.name)
        if self.rows is not None:
            with contextlib.suppress(Exception):
                self.rows.remove_workload(r.name)

    async def _evicted(self, h: _Handle, grace_s: float) -> None:
        if h.proc is not None and h.proc.returncode is None:
            await terminate(h.proc.pid, grace_s, lambda: h.proc.returncode is None)


__all__ = ["EmbeddedBackend", "free_port", "probe"]
