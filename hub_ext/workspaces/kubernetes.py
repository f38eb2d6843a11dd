"""``GpupoolKubeSpawner``: gpupool's spawner for JupyterHub on Kubernetes.

The mixin's form, request rules and remembered choices are reused as they are; what
differs from embedded mode is who places the workspace. On Kubernetes gpupool-scheduler
does (scheduler/kubernetes/README.md), so ``start`` does not submit to the hub's embedded loop
nor wait for its Bind: it turns the checked request into KubeSpawner settings
(``apply_request``) and lets KubeSpawner create the pod and wait for it. KubeSpawner's
progress then shows the pod's events, among them gpupool-scheduler's ``FailedScheduling``
(the reason it waits) and ``Scheduled``.

The pod:

- ``schedulerName: gpupool``; annotations ``gpupool.io/project``, ``gpupool.io/kind:
  workspace``, the GPU ask (``gpupool.io/gpu-fraction`` or ``gpupool.io/gpu-memory``;
  whole GPUs as ``nvidia.com/gpu`` limits), ``gpupool.io/preemptible`` and
  ``gpupool.io/allow-over-quota`` (the form's over-quota opt-in), and for a share of a GPU
  ``gpupool.io/config-map``;
- for a share of a GPU: ``envFrom`` that ConfigMap (written by the scheduler before it
  binds: ``NVIDIA_VISIBLE_DEVICES``, ``GPUPOOL_MEMORY_LIMIT``, ...), the interception
  library's host directory (copied there by gpupool-node-agent) mounted read-only at
  ``preload_mount_dir``, and ``LD_PRELOAD`` pointing into it;
- code-server's configuration and machine settings (``vscode_pod_settings``: the home
  opens trusted, as in embedded mode) from a ``postStart`` hook;
- CPU and memory as guarantee and limit; home on a PVC (KubeSpawner's storage options,
  ``storage_pvc_ensure`` on by default); ``/lab`` or ``/vscode/`` (jupyter-vscode-proxy
  in the image) as the default URL; the image from ``environment_images``.

Credentials and data sources attached to the request (``attach``): checked with the
request (the attach is audited), their values read from the vault and written to one
Secret per workspace (``POD-credentials``) just before KubeSpawner creates the pod (the
delivery is audited); the pod references that Secret by ``secretKeyRef`` or a secret
volume of mode 0400 and mounts each data source (``attach.kube_spawner_settings``), so no
value is in the pod spec. ``stop`` deletes the Secret.

While the pod waits, progress repeats gpupool-scheduler's reason (the pod's
``PodScheduled=False`` message) whenever it changes. A pod that cannot start
(``pod_failure``: image pull errors, a crash loop, a failed pod, a request the scheduler
rejects) ends the spawn at once with that message instead of waiting for
``start_timeout``: KubeSpawner polls ``is_pod_running`` while it waits, and ours raises.
"""

from __future__ import annotations

import asyncio
import time

from kubernetes_asyncio.client.rest import ApiException
from kubespawner import KubeSpawner
from traitlets import Dict, Unicode, default

from gpupool.errors import GpupoolError
from scheduler.contract import (
    SCHEDULER_NAME,
    Preload,
    gpu_parts,
    pod_condition,
    request_annotations,
    waiting_reason,
    workload_annotations,
)
from scheduler.model import DEFAULT_POOL

from .. import humanize
from ..attachments import attach
from ..requests.rules import WORKSPACE_KINDS, FieldError, WorkloadRequest
from .metrics import SPAWN_SECONDS
from .spawner import GpupoolSpawnerMixin, Refused, vscode_pod_settings

__all__ = ["GpupoolKubeSpawner", "PodFailed", "pod_failure"]

HOME_VOLUME = "home"
PRELOAD_VOLUME = Preload.VOLUME

# Container states the kubelet keeps retrying but that no retry fixes by itself.
FATAL_WAITING = frozenset({
    "ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull",
    "CrashLoopBackOff", "CreateContainerConfigError", "CreateContainerError",
    "RunContainerError",
})


class PodFailed(GpupoolError, RuntimeError):
    """The workspace pod cannot start; the message says why (shown to the user)."""


def pod_failure(pod: dict | None) -> str | None:
    """Why ``pod`` (API JSON) will not start, or None while it may still."""
    if not pod:
        return None
    status = pod.get("status") or {}
    sched = pod_condition(pod, "PodScheduled")
    if sched and sched.get("status") == "False" and sched.get("reason") == "InvalidRequest":
        return f"gpupool-scheduler rejected the request: {sched.get('message', '')}"
    statuses = [*(status.get("initContainerStatuses") or []),
                *(status.get("containerStatuses") or [])]
    for cs in statuses:
        waiting = (cs.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in FATAL_WAITING:
            msg = waiting.get("message") or ""
            if waiting["reason"] == "CrashLoopBackOff":
                last = (cs.get("lastState") or {}).get("terminated") or {}
                msg = (f"exited with code {last.get('exitCode', '?')}"
                       f"{' (' + last['reason'] + ')' if last.get('reason') else ''}"
                       f", restarted {cs.get('restartCount', 0)} times")
            return f"container {cs.get('name')}: {waiting['reason']}{': ' + msg if msg else ''}"
    if status.get("phase") in ("Failed", "Succeeded"):
        why = status.get("message") or status.get("reason") or "its containers exited"
        return f"pod {status['phase'].lower()}: {why}"
    return None


def _merged(configured, ours: list[dict]):
    """Configured volumes (KubeSpawner takes a list or a dict keyed for sorting) plus ours."""
    if isinstance(configured, dict):
        return {**configured, **{f"zz-gpupool-{v['name']}": v for v in ours}}
    return [*(configured or []), *ours]


class GpupoolKubeSpawner(GpupoolSpawnerMixin, KubeSpawner):
    """``c.JupyterHub.spawner_class = "hub_ext.workspaces.kubernetes.GpupoolKubeSpawner"``."""

    gpupool_scheduler_name = Unicode(
        SCHEDULER_NAME, config=True, help="schedulerName of workspace pods (gpupool-scheduler's)"
    )
    preload_host_dir = Unicode(
        Preload().host_dir, config=True,
        help="host directory gpupool-node-agent copies the interception library to",
    )
    preload_mount_dir = Unicode(
        Preload().mount_dir, config=True,
        help="where that directory is mounted in the pod (gpupool-scheduler --preload-path's)",
    )
    preload_name = Unicode(Preload().name, config=True, help="the library's file name")
    environment_images = Dict(
        {}, config=True, help="form environment -> image; others use KubeSpawner.image"
    )
    home_mount_path = Unicode("/home/jovyan", config=True, help="where the home PVC is mounted")

    @default("scheduler_name")
    def _default_scheduler_name(self):
        return self.gpupool_scheduler_name

    @default("storage_pvc_ensure")
    def _default_pvc_ensure(self):
        return True

    @default("storage_capacity")
    def _default_storage_capacity(self):
        return "10Gi"

    # -- request -> KubeSpawner settings ---------------------------------------------------
    @property
    def config_map_name(self) -> str:
        return f"{self.pod_name}-gpupool"

    _BASE = ("extra_annotations", "extra_resource_limits", "extra_resource_guarantees",
             "extra_container_config", "environment", "image", "volumes", "volume_mounts",
             "lifecycle_hooks")

    @property
    def credentials_secret_name(self) -> str:
        return attach.secret_name(self.pod_name)

    def apply_request(self, req: WorkloadRequest,
                      att: attach.Attachments | None = None) -> None:
        """Set this spawner's pod settings from a checked request and its checked attachments
        (no I/O). Each call starts from the configured values, so a restart with another
        request keeps nothing of the previous one."""
        if not hasattr(self, "_gp_base"):
            self._gp_base = {k: getattr(self, k) for k in self._BASE}
        base = self._gp_base
        demand = req.demand()
        ann = request_annotations(req.project, "workspace", preemptible=req.preemptible,
                                  allow_over_quota=req.preemptible,
                                  node_pool=req.node_pool if req.node_pool != DEFAULT_POOL else None,
                                  gpu_model=req.gpu_model or None)  # as chosen in the form
        preload = Preload(self.preload_host_dir, self.preload_mount_dir, self.preload_name)
        gpu = gpu_parts(self.pod_name, demand.gpus or demand.gpu_fraction, demand.gpu_memory_mib, preload)
        ann.update(gpu.annotations)
        limits = dict(gpu.limits)
        volumes = [{"name": HOME_VOLUME, "persistentVolumeClaim": {"claimName": "{pvc_name}"}},
                   *gpu.volumes]
        mounts = [{"name": HOME_VOLUME, "mountPath": self.home_mount_path}, *gpu.mounts]
        env: dict[str, str] = dict(gpu.env)
        container: dict = {"envFrom": gpu.env_from} if gpu.shared else {}
        if att:
            parts = attach.kube_spawner_settings(att, self.credentials_secret_name)
            env.update(parts["environment"])
            volumes += parts["volumes"]
            mounts += parts["volume_mounts"]
        ann.update(workload_annotations(self.workload, self.user.name))
        self.extra_annotations = {**base["extra_annotations"], **ann}
        self.extra_resource_limits = {**base["extra_resource_limits"], **limits}
        self.extra_resource_guarantees = {**base["extra_resource_guarantees"], **limits}
        self.extra_container_config = {**base["extra_container_config"], **container}
        self.volumes = _merged(base["volumes"], volumes)
        self.volume_mounts = _merged(base["volume_mounts"], mounts)
        # VS Code (the form's choice, or opened from JupyterLab's launcher) opens the home
        # trusted, as in embedded mode: the same settings, written by a postStart hook
        code_env, hook = vscode_pod_settings(self.workload, req.gpu_label(), self.home_mount_path)
        env.update(code_env)
        self.lifecycle_hooks = {**base["lifecycle_hooks"], "postStart": {"exec": {"command": hook}}}
        self.environment = {**base["environment"], **env}
        self.cpu_limit = self.cpu_guarantee = float(req.cpu)
        self.mem_limit = self.mem_guarantee = int(req.memory_gib * 1024**3)
        self.default_url = "/vscode/" if req.workspace_kind == "vscode" else "/lab"
        env_image = (self.gpupool.cfg.environments.get(req.environment) or {}).get("image")
        self.image = self.environment_images.get(req.environment) or env_image or base["image"]

    # -- start / stop / progress -------------------------------------------------------------
    def _attachments(self, req: WorkloadRequest) -> attach.Attachments:
        """The request's credentials and data sources, checked in its project; the attach
        is audited as in embedded mode. FieldError names the field."""
        if not req.credentials and not req.datasources:
            return attach.Attachments(req.project)
        taken = {self.home_mount_path: "the workspace's home",
                 self.preload_mount_dir: "gpupool's GPU library"}
        with self.gpupool.Session() as s:
            att = attach.check(s, req.project, req.credentials, req.datasources, taken)
            attach.record_use(s, self.user.name, self.workload, att, "attach")
            s.commit()
        return att

    def start(self):
        """Check the request and its attachments, set the pod up, then KubeSpawner's start
        (``_start`` below writes the Secret, then creates the pod; the scheduler places it).
        Returns KubeSpawner's future, as KubeSpawner.start does."""
        try:
            req = self.request()
            att = self._attachments(req)
        except FieldError as e:
            raise Refused(f"Invalid request: {e}", reason="invalid") from None
        self.gpupool.store.save_options(self.user.name, req.to_dict())
        # the hub's row of the workspace (REST, CLI, admin panel); the event log marks it
        # running when gpupool-scheduler binds its pod (hub_ext/cluster_events.py)
        self.gpupool.store.add_workload(self.workload, self.user.name, req, notify=False, server=self.name)
        self.apply_request(req, att)
        self._gp_attached = att
        kind = WORKSPACE_KINDS[req.workspace_kind]
        self._gp_submitted = (f"Submitted {kind} to project {req.project}: {req.gpu_label()}, "
                              f"{req.cpu:g} CPU, {humanize.gib(req.memory_gib)} memory; "
                              f"waiting for gpupool-scheduler")
        if att:
            self._gp_submitted += (
                f". Attached credentials: {', '.join(req.credentials) or '(none)'}; "
                f"data sources: {', '.join(req.datasources) or '(none)'}")
        self._gp_t0, self._gp_project = time.monotonic(), req.project
        return KubeSpawner.start(self)

    async def _start(self):
        """KubeSpawner's start, timed as the embedded spawner's is (queue wait included)."""
        outcome = "failed"
        try:
            result = await self._start_pod()
            outcome = "started"
            return result
        except asyncio.CancelledError:
            outcome = "cancelled"
            raise
        finally:
            SPAWN_SECONDS.labels(self._gp_project, outcome).observe(time.monotonic() - self._gp_t0)

    async def _start_pod(self):
        # KubeSpawner.start wraps this coroutine in the future progress() follows; the
        # Secret the pod references must exist before the pod is created.
        att = getattr(self, "_gp_attached", None)
        if att and att.credentials:
            rt = self.gpupool
            try:
                with rt.Session() as s:
                    vals = attach.values(s, rt.delivery.vault, att)
                    attach.record_use(s, self.user.name, self.workload, att, "deliver")
                    s.commit()
            except FieldError as e:  # deleted since the request was checked
                raise Refused(f"Invalid request: {e}", reason="invalid") from None
            await attach.ensure_secret(self.api, attach.secret_manifest(
                self.credentials_secret_name, self.namespace, vals, {"gpupool.io/kind": "workspace"}))
        elif att:  # data sources only: no values, the delivery is still audited
            with self.gpupool.Session() as s:
                attach.record_use(s, self.user.name, self.workload, att, "deliver")
                s.commit()
        return await KubeSpawner._start(self)

    def is_pod_running(self, pod):
        """KubeSpawner's check while it waits for the pod; a pod that cannot start raises
        (which ends ``start`` with the message; JupyterHub then stops the server)."""
        why = pod_failure(pod)
        if why:
            raise PodFailed(f"Workspace {self.pod_name} cannot start: {why}")
        return KubeSpawner.is_pod_running(self, pod)

    def _reflected_pod(self) -> dict | None:
        try:
            return self.pod_reflector.pods.get(f"{self.namespace}/{self.pod_name}")
        except Exception:  # no reflector yet
            return None

    async def progress(self):
        """KubeSpawner's progress (the pod's events), and gpupool-scheduler's reason each
        time it changes while the pod waits."""
        msg = getattr(self, "_gp_submitted", None)
        if msg:
            yield {"progress": 5, "message": msg, "step": "submitted"}
        queue: asyncio.Queue = asyncio.Queue()

        async def events():
            try:
                async for event in KubeSpawner.progress(self):
                    await queue.put(event)
            finally:
                await queue.put(None)

        task = asyncio.ensure_future(events())
        last = None
        try:
            while True:
                try:
                    event = await asyncio.wait_for(queue.get(), 1.0)
                except asyncio.TimeoutError:
                    event = {}
                if event is None:
                    break
                if event:
                    yield event
                reason = waiting_reason(self._reflected_pod())
                if reason and reason != last:
                    last = reason
                    yield {"message": humanize.waiting(reason, None), "step": "waiting"}
        finally:
            task.cancel()

    async def stop(self, now=False):
        # Deleting the pod is what frees its GPUs: gpupool-scheduler watches it go.
        try:
            await KubeSpawner.stop(self, now=now)
        finally:
            self.gpupool.store.remove_workload(self.workload)
            await self._delete_secret()

    async def _delete_secret(self) -> None:
        """The workspace's credentials Secret goes with it (none is fine: no credentials,
        or a hub restarted since, which keeps no record of what was attached)."""
        try:
            await self.api.delete_namespaced_secret(self.credentials_secret_name, self.namespace)
        except ApiException as e:
            if e.status != 404:
                raise
