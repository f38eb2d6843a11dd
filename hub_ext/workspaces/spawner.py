"""gpupool's spawners. ``GpupoolSpawnerMixin`` holds everything that is not about how a
workspace process is started: the form, the request rules, queueing with the scheduler,
progress events and releasing the GPUs; subclasses only implement ``launch_workspace``.

``GpupoolLocalSpawner`` (embedded mode) starts ``jupyterhub-singleuser`` as a local
process with the placement's environment; the Kubernetes spawner is a KubeSpawner
subclass with the same mixin.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import shutil
import sys
import time
from pathlib import Path

from jupyterhub.spawner import Spawner, SpawnException
from jupyterhub.utils import random_port
from traitlets import default

from gpupool.errors import GpupoolError
from scheduler.embedded.adapter import terminate
from scheduler.model import MILLI, Bind, ValidationError

from .. import humanize
from ..host import launch
from ..host.accounts import AccountError
from ..host.cgroups import Limits
from ..host.errors import LaunchError
from ..host.process import Spec
from ..requests.rules import (
    WORKSPACE_KINDS,
    FieldError,
    WorkloadRequest,
    parse_request,
    workload_name,
)
from ..requests.store import to_workload
from ..runtime import Runtime
from .form import render_form
from .metrics import SPAWN_QUEUE_SECONDS, SPAWN_SECONDS


class Refused(SpawnException, GpupoolError, RuntimeError):
    """A spawn that gpupool refuses (a bad request) or that left the queue: JupyterHub logs
    it without a traceback, answers its status and shows the message as it is."""

    def __init__(self, message: str, *, reason: str, status_code: int = 400):
        super().__init__(message, reason=reason, status_code=status_code)
        self.jupyterhub_message = message


class GpupoolSpawnerMixin(Spawner):
    """Scheduling, form and progress; the class it is mixed into launches the process.
    It derives from Spawner so that its trait defaults apply; put it first:
    ``class X(GpupoolSpawnerMixin, SomeSpawner)``."""

    @property
    def gpupool(self) -> Runtime:
        return Runtime.instance()

    @property
    def workload(self) -> str:
        return workload_name(self.user.name, self.name)

    @default("apply_user_options")
    def _default_apply(self):
        return lambda spawner, options: None  # start() checks and applies them

    @default("options_form")
    def _default_options_form(self):
        return render_form

    @property
    def hub_scopes(self) -> set[str]:
        """The user's JupyterHub scopes (hub_ext.roles: a platform admin may start anywhere)."""
        from jupyterhub.scopes import get_scopes_for

        try:
            return set(get_scopes_for(self.user.orm_user))
        except AttributeError:  # a user object without an ORM row (unit tests)
            return set()

    def options_from_form(self, formdata):  # traitlets allow overriding by method
        notes: list[str] = []
        req = parse_request(formdata, self.gpupool.limits(self.user.name, self.hub_scopes), notes)
        if notes:
            self.log.warning("spawn form of %s: %s", self.user.name, "; ".join(notes))
        return req.to_dict()

    def request(self) -> WorkloadRequest:
        options = dict(self.user_options or {}) or self.gpupool.store.last_options(self.user.name)
        return parse_request(options, self.gpupool.limits(self.user.name, self.hub_scopes))

    # -- progress ------------------------------------------------------------------------
    def _emit(self, progress: int, message: str, step: str = "") -> None:
        """One progress event; ``step`` (submitted, waiting, placed, starting) names the line
        of the progress page's step list it fills in (templates/hub/spawn_pending.html)."""
        if not hasattr(self, "_gp_events"):
            self._gp_events, self._gp_new = [], asyncio.Event()
        event: dict = {"progress": progress, "message": message}
        if step:
            event["step"] = step
        self._gp_events.append(event)
        self._gp_new.set()

    async def progress(self):
        if not hasattr(self, "_gp_events"):
            self._gp_events, self._gp_new = [], asyncio.Event()
        sent = 0
        while True:
            while sent < len(self._gp_events):
                yield self._gp_events[sent]
                sent += 1
            self._gp_new.clear()
            await self._gp_new.wait()

    # -- start / stop --------------------------------------------------------------------
    async def start(self):
        self._gp_events, self._gp_new = [], asyncio.Event()
        t0 = time.monotonic()
        rt = self.gpupool
        try:
            req = self.request()
            rt.attach_check(self.user.name, self.workload, req)
        except FieldError as e:
            raise Refused(f"Invalid request: {e}", reason="invalid") from None
        rt.store.save_options(self.user.name, req.to_dict())
        kind = WORKSPACE_KINDS[req.workspace_kind]
        self._emit(5, f"Submitted {kind} to project {req.project}: {req.gpu_label()}, "
                      f"{req.cpu:g} CPU, {humanize.gib(req.memory_gib)} memory", "submitted")
        submitted = rt.store.add_workload(self.workload, self.user.name, req, notify=False, server=self.name)
        w = req.workload(self.workload, submitted)
        try:
            waiter = rt.embedded.scheduler.submit(w, evict=self._evict)
        except ValidationError as e:
            rt.store.remove_workload(self.workload)
            raise Refused(f"Cannot schedule: {e}", reason="invalid") from None
        try:
            bind = await self._wait_for_bind(waiter)
        except asyncio.CancelledError:  # JupyterHub cancels a pending spawn that is stopped
            self._cancel_queued(req, t0)
            raise
        SPAWN_QUEUE_SECONDS.labels(req.project).observe(time.monotonic() - t0)
        pod = bind.pods[0]
        where = f"{pod.node}, GPU {','.join(map(str, pod.gpu_indices))}" if pod.gpu_indices else pod.node
        share = f" ({pod.gpu_milli / MILLI:g} of each)" if pod.gpu_indices else ""
        self._emit(50, f"Placed on {where}{share}{' over quota: may be reclaimed' if bind.over_quota else ''}",
                   "placed")
        self._emit(70, f"Starting {kind}", "starting")
        try:
            self.gpupool_env = {**rt.embedded.env_for(w, bind), **rt.delivery.env(
                self.workload, self.user.name, req.project, req.credentials, req.datasources,
                getattr(self, "home_dir", None), account=getattr(self, "account", None))}
            if req.credentials or req.datasources:
                self._emit(75, f"Attached credentials: {', '.join(req.credentials) or '(none)'}; "
                               f"data sources: {', '.join(req.datasources) or '(none)'}")
            started = await self.launch_workspace(req, bind)
        except BaseException:
            SPAWN_SECONDS.labels(req.project, "failed").observe(time.monotonic() - t0)
            rt.delivery.cleanup(self.workload)
            rt.embedded.scheduler.release(self.workload, "failed to start")
            rt.store.remove_workload(self.workload)
            if isinstance(sys.exc_info()[1], asyncio.CancelledError):
                self.server = None  # stopped while starting: not ready (see _cancel_queued)
            raise
        SPAWN_SECONDS.labels(req.project, "started").observe(time.monotonic() - t0)
        return started

    async def _wait_for_bind(self, waiter) -> Bind:
        last = None
        while not waiter.bound.done():
            get = asyncio.ensure_future(waiter.updates.get())
            await asyncio.wait({waiter.bound, get}, return_when=asyncio.FIRST_COMPLETED)
            if not get.done():
                get.cancel()
                continue
            p = get.result()
            if (p.reason, p.queue_position) != last:
                last = (p.reason, p.queue_position)
                self._emit(20, humanize.waiting(p.reason, p.queue_position), "waiting")
        if waiter.bound.cancelled():  # released by someone else while our task goes on
            raise Refused("Cancelled: the request left the queue", reason="cancelled", status_code=409)
        return waiter.bound.result()

    def _cancel_queued(self, req: WorkloadRequest, t0: float) -> None:
        """A spawn stopped before it was placed: give back its queue slot at once, say so in
        the event log and the progress, and leave nothing that looks like a server: JupyterHub
        stops the spawner a second after cancelling it, and until then a spawner that still has
        its server counts as ready (the progress page would send the browser to a server that
        never ran)."""
        rt = self.gpupool
        waited = time.monotonic() - t0
        # A stop cancels JupyterHub's whole spawn task; start_timeout cancels only start()
        spawn = getattr(self, "_spawn_future", None)
        stopped = spawn is None or not hasattr(spawn, "cancelling") or spawn.cancelling() > 0
        why = ("stopped while it waited in the queue" if stopped
               else f"still waiting in the queue after start_timeout ({self.start_timeout} s)")
        SPAWN_SECONDS.labels(req.project, "cancelled").observe(waited)
        rt.embedded.scheduler.release(self.workload, "cancelled")
        rt.store.remove_workload(self.workload)
        rt.store.event("cancelled", f"{self.workload} cancelled: {why} ({waited:.0f} s)",
                       self.workload, req.project)
        self._emit(100, f"Cancelled: {why}")
        self.server = None

    async def _evict(self, grace_s: float) -> None:
        self._emit(90, "Evicted by the scheduler")
        pid = getattr(self, "pid", 0)
        if pid:
            await terminate(pid, grace_s, lambda: _alive(pid))
        self.gpupool.embedded.scheduler.release(self.workload, "evicted")
        self.gpupool.store.remove_workload(self.workload)
        self.gpupool.delivery.cleanup(self.workload)

    async def stop(self, now=False):
        try:
            await super().stop(now=now)
        finally:
            self.gpupool.embedded.scheduler.release(self.workload, "stopped")
            self.gpupool.store.remove_workload(self.workload)
            self.gpupool.delivery.cleanup(self.workload)

    async def poll(self):
        return await super().poll()

    async def launch_workspace(self, req: WorkloadRequest, bind: Bind):
        raise NotImplementedError


# VS Code opens the home as a trusted folder (workspace trust guards against code from
# strangers; a user's own home is not that), looks for no repository above it, and opens on
# the files, not on a chat panel for an AI service nobody set up.
VSCODE_MACHINE_SETTINGS = {"security.workspace.trust.enabled": False, "git.openRepositoryInParentFolders": "never",
                           "workbench.secondarySideBar.defaultVisibility": "hidden", "chat.disableAIFeatures": True}


def vscode_config(workload: str, share: str) -> str:
    """code-server's config.yaml for one start: the workspace's name and GPU share as the
    app name, which VS Code shows in its window title."""
    return (f"disable-workspace-trust: true\n"
            f"app-name: {json.dumps(f'gpupool {workload} ({share})')}\n")


VSCODE_SETTINGS_PATH = (".local", "share", "code-server", "Machine")  # in the home
VSCODE_CONFIG_DIR = "/tmp/gpupool-code-server"  # a container's (Kubernetes)


def vscode_pod_settings(workload: str, share: str, home: str) -> tuple[dict[str, str], list[str]]:
    """The same for a workspace container (Kubernetes): the environment that points
    code-server at its configuration, and the command of the container's ``postStart``
    hook that writes that configuration and seeds the machine settings in ``home`` (the
    home claim keeps the user's own version). The kubelet runs the hook before it reports
    the container running, so before code-server can start."""
    config = f"{VSCODE_CONFIG_DIR}/config.yaml"
    machine = "/".join((home.rstrip("/"), *VSCODE_SETTINGS_PATH))
    script = (f"umask 077; mkdir -p {VSCODE_CONFIG_DIR} "
              f"&& printf '%s' {shlex.quote(vscode_config(workload, share))} > {config}; "
              f'[ -e "{machine}/settings.json" ] || {{ mkdir -p "{machine}" && printf \'%s\\n\' '
              f'{shlex.quote(json.dumps(VSCODE_MACHINE_SETTINGS, indent=2))} > "{machine}/settings.json"; }}; exit 0')
    return {"CODE_SERVER_CONFIG": config}, ["/bin/sh", "-c", script]


def vscode_settings(account, workload: str, share: str) -> dict[str, str]:
    """code-server's configuration for one start, and its machine settings seeded once in
    the account's home (the user may change them there); the environment that points
    code-server at the configuration."""
    launch.remove_private(account, "code-server")
    folder = launch.write_private(account, ("code-server",), {"config.yaml": vscode_config(workload, share)})
    launch.seed_file(account, VSCODE_SETTINGS_PATH, "settings.json",
                     json.dumps(VSCODE_MACHINE_SETTINGS, indent=2) + "\n")
    return {"CODE_SERVER_CONFIG": str(folder / "config.yaml")}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie child counts as gone
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


class GpupoolLocalSpawner(GpupoolSpawnerMixin, Spawner):
    """Embedded mode: each workspace is a local ``jupyterhub-singleuser`` process run by the
    host launcher (``hub_ext.host``) as its owner's own OS account, in that account's home,
    under the cgroup limits of the request. The process outlives the hub: after a restart
    ``load_state`` finds it again and the hub keeps routing to it."""

    @default("cmd")
    def _cmd(self):
        return [str(Path(sys.executable).parent / "jupyterhub-singleuser")]

    def get_env(self):
        env = super().get_env()
        env.update(getattr(self, "gpupool_env", {}))
        bindir = str(Path(sys.executable).parent)
        path = [bindir, env.get("PATH", "/usr/local/bin:/usr/bin:/bin")]
        cs = self.gpupool.cfg.code_server
        if cs:
            path.insert(0, str(Path(cs).parent))
            env["CODE_EXECUTABLE"] = "code-server"
            env["CODE_WORKINGDIR"] = self.home_dir
        env["PATH"] = ":".join(path)
        env["GPUPOOL_WORKLOAD"] = self.workload
        return env

    @property
    def home_dir(self) -> str:
        account = getattr(self, "account", None)
        return str(account.home) if account is not None else ""

    async def start(self):
        try:  # first: attached files and links go into the account's home
            self.account = await asyncio.get_running_loop().run_in_executor(
                None, self.gpupool.embedded.accounts.for_user, self.user.name)
        except AccountError as e:
            raise RuntimeError(f"No OS account for {self.user.name}: {e}") from None
        return await super().start()

    async def launch_workspace(self, req: WorkloadRequest, bind: Bind):
        rt = self.gpupool
        if req.workspace_kind == "vscode":
            if not rt.cfg.code_server or not shutil.which(rt.cfg.code_server):
                raise RuntimeError("VS Code is not installed on this hub (code-server missing)")
            self.default_url = "/vscode/"
            env = getattr(self, "gpupool_env", {})
            self.gpupool_env = {**env, **vscode_settings(self.account, self.workload, humanize.gpu_share(env))}
        else:
            self.default_url = "/lab"
        self.cpu_limit, self.mem_limit = req.cpu, int(req.memory_gib * 1024**3)
        t0 = time.monotonic()
        self.port = self.port or random_port()
        env, argv = launch.in_environment(rt.cfg.environments.get(req.environment),
                                          {**launch.account_env(self.account), **self.get_env()},
                                          [*self.cmd, *self.get_args()])
        spec = Spec(name=self.workload, argv=argv, env=env,
                    cwd=str(self.account.home), account=self.account,
                    limits=Limits(cpu=req.cpu, memory_bytes=self.mem_limit,
                                  gpu_devices=tuple(d for p in bind.pods for d in launch.gpu_devices(
                                      rt.embedded.scheduler.snapshot.nodes[p.node], p))),
                    log_path=str(launch.output_log(self.account.home, "workspace", self.workload)))
        self._handle = await launch.start(rt.embedded.launcher, spec)
        self.pid = self._handle.pid
        self._watch = asyncio.ensure_future(self._watch_exit(self._handle))
        self.log.info("gpupool: %s launched in %.2fs as %s", self.workload, time.monotonic() - t0,
                      self.account.name)
        return (self.ip or "127.0.0.1", self.port)

    async def _watch_exit(self, handle, poll_s: float = 0.5) -> None:
        """A workspace that ends by itself (crash, OOM, SIGKILL) gives its GPUs back within
        one poll of its handle, with an event that says how it ended; JupyterHub's own poll
        then tidies the server away. A process inside it killed for memory (a kernel, most
        often) is reported too, while the workspace goes on."""
        rt = self.gpupool
        row = rt.store.get(self.workload)
        project = row.project if row is not None else ""
        ooms = handle.group.oom_kills()
        while (end := handle.exit()) is None:
            if (n := handle.group.oom_kills()) > ooms:
                ooms = n
                limit = humanize.size(handle.memory_limit_bytes) if handle.memory_limit_bytes else "none"
                rt.store.event("oom-killed", f"a process of {self.workload} was killed: out of memory "
                               f"(limit {limit}); the workspace goes on", self.workload, project)
            await asyncio.sleep(poll_s)
        kind = "oom-killed" if end.oom else "exited"
        rt.store.event(kind, f"{self.workload} ended: {end.describe()}", self.workload, project)
        rt.embedded.scheduler.release(self.workload, end.describe())
        rt.store.remove_workload(self.workload)
        rt.delivery.cleanup(self.workload, getattr(self, "account", None))

    def _adopted(self):
        """The handle of the running process, found again after a hub restart."""
        handle = getattr(self, "_handle", None)
        if handle is None and self.pid:
            handle = self._handle = self.gpupool.embedded.launcher.adopt(self.workload)
            row = self.gpupool.store.get(self.workload)
            if handle is not None and row is not None:
                self.account = self.gpupool.embedded.accounts.for_user(self.user.name)
                self.gpupool.embedded.scheduler.adopt(to_workload(row), self._evict)
                self._watch = asyncio.ensure_future(self._watch_exit(handle))
        return handle

    def load_state(self, state):
        super().load_state(state)
        self.pid = state.get("pid", 0)

    def get_state(self):
        state = super().get_state()
        if self.pid:
            state["pid"] = self.pid
        return state

    def clear_state(self):
        super().clear_state()
        self.pid = 0
        self._handle = None

    async def poll(self):
        handle = self._adopted()
        if handle is None:
            return 0  # nothing of ours runs
        if handle.alive():
            return None
        end = handle.exit()
        return end.code if end is not None and end.code is not None else 1

    async def _end(self, grace_s: float, reason: str) -> None:
        """Stop the process (if it runs) and give everything back; no "exited" event."""
        handle = self._adopted()
        watch = getattr(self, "_watch", None)
        if watch is not None:
            watch.cancel()
        try:
            if handle is not None and handle.alive():
                await handle.terminate(grace_s)
        finally:
            self.gpupool.embedded.scheduler.release(self.workload, reason)
            self.gpupool.store.remove_workload(self.workload)
            self.gpupool.delivery.cleanup(self.workload, getattr(self, "account", None))
        if handle is not None:
            with contextlib.suppress(LaunchError):  # still running: its run folder stays
                self.gpupool.embedded.launcher.forget(handle.name)

    async def stop(self, now=False):
        await self._end(0 if now else 5.0, "stopped")

    async def _evict(self, grace_s: float) -> None:
        self._emit(90, "Evicted by the scheduler")
        await self._end(grace_s, "evicted")
